#!/usr/bin/env bash
# Build the image and run `docker compose` end to end: PostgreSQL, migrate, serve,
# readiness, and a signed webhook answered through the composed stack.
#
# Uses the Docker daemon if one answers; otherwise (as root, with dockerd installed)
# starts its own without iptables or a bridge, on its own socket, and stops it at the
# end. The base image is BASE_IMAGE; unset, a local one is made once with debootstrap
# and `docker import` (local/debian-python:bookworm), for machines that reach the Debian
# and PyPI mirrors but no image registry. Exit 77 means "skipped: no Docker here".
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK=${DOCKER_E2E_WORK:-${TMPDIR:-/tmp}/chatgate-docker-e2e}
BASE_IMAGE=${BASE_IMAGE:-local/debian-python:bookworm}
PROJECT=chatgate-e2e
COMPOSE=(docker-compose -p "$PROJECT" -f docker-compose.yml -f docker/compose.e2e.yml)
WEBHOOK_SECRET=e2e-webhook-secret-$RANDOM$RANDOM
ADMIN_TOKEN=e2e-admin-token-$RANDOM$RANDOM
mkdir -p "$WORK"
CHATGATE_ENV_FILE="$WORK/chatgate.env"  # the compose file's env file: nothing more than the above
: >"$CHATGATE_ENV_FILE"
export BASE_IMAGE WEBHOOK_SECRET ADMIN_TOKEN CHATGATE_ENV_FILE
step() { printf '== %s\n' "$*"; }

DAEMON_PID=""
cleanup() {
  set +e
  if [ -n "${COMPOSE_UP:-}" ]; then "${COMPOSE[@]}" logs --no-color >"$WORK/compose.log" 2>&1; "${COMPOSE[@]}" down -v >/dev/null 2>&1; fi
  rm -f "$ROOT"/docker/build-ca/*.crt
  if [ -n "$DAEMON_PID" ]; then kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null; fi
}
trap cleanup EXIT

# --- 1. a Docker daemon ----------------------------------------------------------------
if ! docker info >/dev/null 2>&1; then
  if ! command -v dockerd >/dev/null || [ "$(id -u)" != 0 ]; then
    echo "SKIP: no Docker daemon answers, and none can be started here (needs root and dockerd)"
    exit 77
  fi
  step "starting dockerd (no iptables, no bridge) in $WORK"
  dockerd --iptables=false --bridge=none --data-root "$WORK/data" --exec-root "$WORK/exec" \
    --pidfile "$WORK/dockerd.pid" --host "unix://$WORK/docker.sock" >"$WORK/dockerd.log" 2>&1 &
  DAEMON_PID=$!
  export DOCKER_HOST="unix://$WORK/docker.sock"
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 0.5; done
  docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log"; echo "FAIL: dockerd did not start"; exit 1; }
fi
command -v docker-compose >/dev/null || { echo "SKIP: docker-compose is not installed"; exit 77; }

# --- 2. the base image -----------------------------------------------------------------
if ! docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
  if [ "$BASE_IMAGE" != local/debian-python:bookworm ]; then
    docker pull "$BASE_IMAGE"
  else
    command -v debootstrap >/dev/null || { echo "SKIP: debootstrap is not installed"; exit 77; }
    # The Debian mirror this machine's apt sources name (not security, not other vendors).
    mirror=${DEBIAN_MIRROR:-$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -E '^(deb|URIs:) ' \
      | grep -oE 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -1 | tr -d ' ' || true)}
    mirror=${mirror:-http://deb.debian.org/debian}
    step "making $BASE_IMAGE with debootstrap from $mirror"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
      bookworm "$WORK/rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1
    chroot "$WORK/rootfs" apt-get clean
    tar --numeric-owner -C "$WORK/rootfs" -c . | docker import -c 'ENV LANG=C.UTF-8' \
      -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE_IMAGE" >/dev/null
    rm -rf "$WORK/rootfs"
  fi
fi

# --- 3. build (the machine's extra CA certificates in the build stage only) ----------------
cp /usr/local/share/ca-certificates/*.crt docker/build-ca/ 2>/dev/null || true
step "building the images on $BASE_IMAGE"
"${COMPOSE[@]}" build >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; echo "FAIL: build"; exit 1; }
rm -f docker/build-ca/*.crt
if docker run --rm --entrypoint sh chatgate-e2e -c 'ls /usr/local/share/ca-certificates/build-ca 2>/dev/null' | grep -q .; then
  echo "FAIL: build CA certificates reached the final image"; exit 1
fi

# --- 4. compose up: migrate and serve --------------------------------------------------
CHATGATE_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CHATGATE_PORT
step "docker-compose up"
COMPOSE_UP=1
"${COMPOSE[@]}" up -d >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log"; echo "FAIL: compose up"; exit 1; }

in_app() { "${COMPOSE[@]}" exec -T chatgate "$@"; }
ready=""
for _ in $(seq 120); do
  if in_app python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)" >/dev/null 2>&1; then
    ready=1; break
  fi
  sleep 1
done
[ -n "$ready" ] || { "${COMPOSE[@]}" logs --no-color | tail -40; echo "FAIL: /readyz never answered 200"; exit 1; }
step "ready: /readyz answered 200 inside the chatgate container"
whoami_in=$(in_app sh -c 'id -u')
[ "$whoami_in" = 10001 ] || { echo "FAIL: the service runs as uid $whoami_in, not 10001"; exit 1; }

# --- 5. a signed webhook, signed with openssl by the published rule ----------------------
body='{"chat_id": "e2e", "sender_id": "u1", "text": "hello from compose"}'
ts=$(date +%s)
sig=$(printf '%s.%s' "$ts" "$body" | openssl dgst -sha256 -hmac "$WEBHOOK_SECRET" -hex | sed 's/^.* //')
answer=$(in_app env BODY="$body" TS="$ts" SIG="$sig" python3 -c '
import os, urllib.request
req = urllib.request.Request(
    "http://127.0.0.1:8000/channels/webhook?wait=true", data=os.environ["BODY"].encode(),
    headers={"Content-Type": "application/json", "X-Chatgate-Timestamp": os.environ["TS"],
             "X-Chatgate-Signature": "sha256=" + os.environ["SIG"]})
print(urllib.request.urlopen(req, timeout=30).read().decode())')
echo "$answer"
case "$answer" in
  *'"session_key":"webhook:e2e"'*'You said: hello from compose'*) ;;
  *) echo "FAIL: unexpected webhook answer"; exit 1 ;;
esac
health=$(docker inspect --format '{{.State.Health.Status}}' "$("${COMPOSE[@]}" ps -q chatgate)" 2>/dev/null || echo none)
step "image HEALTHCHECK status: $health"
echo "OK: image built on $BASE_IMAGE; compose migrated, served, answered a signed webhook"
