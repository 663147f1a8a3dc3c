#!/usr/bin/env bash
# What the Dockerfile does, without a Docker engine: install the project as a package
# (`pip install .`, not editable) into a fresh virtual environment, then run
# `chatgate serve` from a directory outside the checkout against a fresh PostgreSQL
# database, and check that it migrated, is ready, and answers a signed webhook.
#
#   bash scripts/check_package.sh
#
# Needs PyPI (or a mirror) for the install and PostgreSQL on 127.0.0.1:5432 (user
# `postgres`, trust auth). It does not check the image itself: the base image, the
# non-root user or the HEALTHCHECK.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python3.11}
WORK="$(mktemp -d)"
DB="chatgate_pkg_$$"
PORT=${PORT:-18765}
SECRET=package-check-secret
PG=(psql -h 127.0.0.1 -U postgres -qAt)
SERVER=""

cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  "${PG[@]}" -c "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '$DB'" >/dev/null || true
  "${PG[@]}" -c "DROP DATABASE IF EXISTS $DB" >/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT

echo "installing the package into a fresh venv"
"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-cache-dir "$ROOT"
"${PG[@]}" -c "CREATE DATABASE $DB"

echo "serving from $WORK/home on port $PORT"
mkdir "$WORK/home"
(
  cd "$WORK/home"
  exec env -i PATH="$WORK/venv/bin:/usr/bin:/bin" HOME="$WORK/home" PYTHONDONTWRITEBYTECODE=1 \
    HOST=127.0.0.1 PORT="$PORT" DATABASE_URL="postgresql://postgres@127.0.0.1:5432/$DB" \
    ADMIN_TOKEN=package-check-admin WEBHOOK_SECRET="$SECRET" LLM_PROVIDER=offline \
    DB_CONNECT_RETRY_SECONDS=30 chatgate serve
) >"$WORK/serve.log" 2>&1 &
SERVER=$!

for _ in $(seq 1 60); do
  if curl -fs -o /dev/null "http://127.0.0.1:$PORT/readyz"; then break; fi
  if ! kill -0 "$SERVER" 2>/dev/null; then cat "$WORK/serve.log"; echo "FAIL: the server exited"; exit 1; fi
  sleep 0.5
done
curl -fs -o /dev/null "http://127.0.0.1:$PORT/readyz" || { cat "$WORK/serve.log"; echo "FAIL: not ready"; exit 1; }
echo "ready (migrations ran from the installed package)"

body='{"chat_id": "c1", "sender_id": "u1", "text": "hello", "external_id": "package-check-1"}'
ts=$(date +%s)
sig=$(printf '%s.%s' "$ts" "$body" | openssl dgst -sha256 -hmac "$SECRET" -hex | sed 's/^.* //')
answer=$(curl -fs "http://127.0.0.1:$PORT/channels/webhook?wait=true" \
  -H 'Content-Type: application/json' \
  -H "X-Chatgate-Timestamp: $ts" -H "X-Chatgate-Signature: sha256=$sig" -d "$body")
echo "webhook answered: $answer"
case "$answer" in
  *'"replies":[{'*) ;;
  *) echo "FAIL: no reply in the answer"; exit 1 ;;
esac
curl -fs -o /dev/null "http://127.0.0.1:$PORT/admin" || { echo "FAIL: the dashboard page"; exit 1; }
echo "OK: the installed package serves (dashboard page included)"
