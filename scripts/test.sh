#!/usr/bin/env bash
# The whole test suite: services it needs, lint, types, tests. `make test` runs this.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

# PostgreSQL: the tests that need it never skip, so make sure it runs.
wait_for_postgres() {  # up to 30 s; if it never comes, the tests say so plainly
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
}
if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
  wait_for_postgres
fi
# Connections: six workers, each test with its own database and up to three server processes
# (a pool of up to DB_POOL_SIZE=20 each, as in production) peak at ~70 on a quick host; on a
# slow one the heavy tests overlap longer and went past PostgreSQL's default 100 ("sorry,
# too many clients already"). The suite's cluster gets room for 300 (a restart, once).
pg_max=$(psql -h 127.0.0.1 -U postgres -Atc "SHOW max_connections" 2>/dev/null || echo 0)
if [ "${pg_max:-0}" -lt 300 ]; then
  echo "PostgreSQL max_connections is ${pg_max}: raising it to 300 for the suite (restart)"
  if psql -h 127.0.0.1 -U postgres -qc "ALTER SYSTEM SET max_connections = 300" \
    && pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main restart; then
    wait_for_postgres
  else
    echo "could not raise max_connections: a slow host may see 'too many clients'" >&2
  fi
fi

# Chromium for the browser tests (Debian's packages; Playwright does not download one).
if [ ! -x /usr/bin/chromium ]; then
  echo "installing chromium"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
fi
# PgBouncer for the pooler tests (tests/app/db/test_pgbouncer.py start their own).
if ! command -v pgbouncer >/dev/null 2>&1 && [ ! -x /usr/sbin/pgbouncer ]; then
  echo "installing pgbouncer"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq pgbouncer >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null; }
fi
# Dovecot (IMAP) for the email channel's tests (tests/channels/email start their own).
if [ ! -x /usr/sbin/dovecot ]; then
  echo "installing dovecot-imapd"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq dovecot-imapd >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq dovecot-imapd >/dev/null; }
fi
# A CJK font, so the Chinese dashboard screenshots show characters, not boxes (5 MB).
if ! fc-list :lang=zh 2>/dev/null | grep -q .; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq fonts-wqy-microhei >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq fonts-wqy-microhei >/dev/null; } \
    || echo "no CJK font installed: Chinese screenshots will show boxes (the tests still run)"
fi

# promtool for the Prometheus alerting rules' tests (deploy/prometheus).
if ! command -v promtool >/dev/null 2>&1; then
  echo "installing prometheus (promtool)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
fi

# Synapse for the Matrix tests (a real homeserver): from PyPI into its own virtualenv
# (CHATGATE_SYNAPSE_VENV, default ~/.cache/chatgate-test/synapse-venv), not ours. On a new
# machine that takes ~25 s: it goes on in the background while lint and the first tests
# run; the Matrix tests' fixture waits for it on the installer's lock (tests/support/synapse.py)
# and installs it itself if this failed.
"$VENV/bin/python" -m tests.support.synapse >/dev/null 2>&1 &

# Cache compiled bytecode for the run, outside the tree. The suite starts a few hundred
# Python processes (`chatgate serve`, the CLI) and every pytest worker rewrites the asserts of
# every test module while collecting; with PYTHONDONTWRITEBYTECODE set (as in the machines
# the suite runs on, and in our Docker image) each of them compiled it all from source again.
unset PYTHONDONTWRITEBYTECODE
TEST_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/chatgate-test"
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-$TEST_CACHE/pycache}"

"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
# The type check runs beside the first phase (that phase is bound by the CPU anyway, so mypy's
# half a minute of CPU costs it ~15 s) and is waited for after it; a type error still fails
# the run. Its cache lives beside the bytecode's, outside the tree: a fresh clone on a machine
# that ran the suite before checks only what changed (0.9 s instead of 30 CPU-s; mypy
# compares each module's hash, so a stale entry is rechecked, never trusted).
mkdir -p test-artifacts
"$VENV/bin/mypy" --cache-dir "$TEST_CACHE/mypy" app channels tests bench >test-artifacts/mypy.txt 2>&1 &
mypy_pid=$!
trap 'kill "$mypy_pid" 2>/dev/null || true' EXIT
# A phase whose tests failed runs those tests once more, alone, as CPython's regrtest re-runs
# its failed tests: on 2 CPUs with six workers a timing test can lose its race to the load.
# The phase passes only when each of them passes then; they are named loudly as flaky (and
# in test-artifacts/flaky.txt) so that they get mended. More than eight failures is a
# breakage, not a flake, and gets no second run (on a host 2.5x slower than usual, four
# timing tests of 2,000 once lost their races in one run). Exit code 5 (nothing collected, e.g. a -k
# that matches no serial test) is not a failure.
lastfailed=.pytest_cache/v/cache/lastfailed

# The tests' fixed deadlines (tests/support/timing.py) scale with this host's speed unless
# TEST_TIME_SCALE is set: the same pure-Python loop as bench/ab_webhook.py's calibration,
# against the 70 ms it takes on the machines the deadlines were set on (at least 1, at
# most 3). A deadline bounds how long a correct system may take: a longer one costs a
# passing run nothing, and a slow host (seen: 2.5x) no longer fails on the clock.
if [ -z "${TEST_TIME_SCALE:-}" ]; then
  TEST_TIME_SCALE=$("$VENV/bin/python" -c '
import time
def loop():
    started, total = time.perf_counter(), 0
    for i in range(2_000_000):
        total += i & 7
    return time.perf_counter() - started
print(round(min(3.0, max(1.0, min(loop() for _ in range(3)) * 1000 / 70)), 1))')
  export TEST_TIME_SCALE
  echo "TEST_TIME_SCALE=$TEST_TIME_SCALE (this host's speed)"
fi

phase() {
  local marker=$1 status=0 failed
  shift
  "$VENV/bin/pytest" --cache-clear -m "$marker" "$@" "${ARGS[@]}" || status=$?
  if [ "$status" -eq 0 ] || [ "$status" -eq 5 ]; then return 0; fi
  [ "$status" -eq 1 ] && [ -f "$lastfailed" ] || return "$status"
  # Test ids as pytest-xdist recorded them: `--dist loadgroup` adds "@group" to a grouped one.
  failed=$("$VENV/bin/python" -c 'import json, re, sys; print("\n".join(sorted({re.sub(r"@[^@\]]*$", "", k) for k in json.load(open(sys.argv[1]))})))' "$lastfailed")
  if [ -z "$failed" ] || [ "$(wc -l <<<"$failed")" -gt 8 ]; then return 1; fi
  mkdir -p test-artifacts
  printf '%s\n' "$failed" >>test-artifacts/flaky.txt
  printf '\n=== FLAKY: failed once, running again alone ===\n%s\n\n' "$failed"
  local ids
  mapfile -t ids <<<"$failed"
  "$VENV/bin/pytest" -p no:xdist -m "$marker" "${ids[@]}"
}

# Three phases: everything not marked `serial` on several workers (most of the time goes to
# waiting on servers, subprocesses and sleeps, so workers pay even on 2 CPUs); then the
# `serial` tests three at a time (replicas waiting out lease TTLs, restarts: mostly idle,
# but upset by a machine the parallel phase loads); then the `alone` ones, one at a time
# (wall-time, memory and flush measurements, CPU-heavy floods). Tests in one `xdist_group`
# stay on one worker.
ARGS=("$@")
rm -f test-artifacts/flaky.txt
# The first phase collects the whole suite and notes which files hold `serial` tests
# (tests/conftest.py); the later phases collect only those. With arguments of one's own
# (a path, -k) they collect as the arguments say.
serial_files=test-artifacts/serial-files.txt
rm -f "$serial_files"
TEST_SERIAL_FILES=$serial_files phase "not serial" -n "${TEST_WORKERS:-6}" --dist loadgroup
status=0
wait "$mypy_pid" || status=$?
cat test-artifacts/mypy.txt
[ "$status" -eq 0 ] || { echo "mypy failed"; exit "$status"; }
if [ ${#ARGS[@]} -eq 0 ] && [ -s "$serial_files" ]; then
  mapfile -t ARGS <"$serial_files"
fi
phase "serial and not alone" -n "${TEST_SERIAL_WORKERS:-3}" --dist loadgroup
phase alone
if [ -f test-artifacts/flaky.txt ]; then
  printf '\n=== passed on a second run alone (flaky, to be mended) ===\n'
  cat test-artifacts/flaky.txt
fi
