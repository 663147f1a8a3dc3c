#!/usr/bin/env bash
# The whole test suite: services it needs, lint, types, tests. `make test` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

# PostgreSQL: the tests that need it never skip, so make sure it runs.
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi

# Chromium for the browser tests (Debian's packages; Playwright does not download one).
if [ ! -x /usr/bin/chromium ]; then
  echo "installing chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# A CJK font, so the Chinese dashboard screenshots show characters, not boxes (5 MB).
if ! fc-list :lang=zh 2>/dev/null | grep -q .; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq fonts-wqy-microhei >/dev/null; } \
    || echo "no CJK font installed: Chinese screenshots will show boxes (the tests still run)"
fi

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
"$VENV/bin/mypy" app channels tests bench
# Two phases: everything not marked `serial` on several workers (most of the time goes to
# waiting on servers, subprocesses and sleeps, so workers pay even on 2 CPUs); then the
# `serial` tests alone (timing-sensitive, fixed ports, heavy crash tests). Tests in one
# `xdist_group` stay on one worker. Exit code 5 (nothing collected, e.g. a -k that
# matches no serial test) is not a failure.
status=0
"$VENV/bin/pytest" -n "${TEST_WORKERS:-4}" --dist loadgroup -m "not serial" "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
status=0
"$VENV/bin/pytest" -m serial "$@" || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then exit "$status"; fi
