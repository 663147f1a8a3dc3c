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
"$VENV/bin/pytest" "$@"
