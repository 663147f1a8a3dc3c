#!/bin/sh
# Initialise the cluster once (user, password, database from the environment), then serve.
set -eu
user=${POSTGRES_USER:-postgres}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:-postgres}" >"$pwfile"
  initdb -D "$PGDATA" -U "$user" --pwfile="$pwfile" --auth-host=scram-sha-256 --auth-local=trust >/dev/null
  rm -f "$pwfile"
  echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  if [ -n "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != postgres ]; then
    pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
    createdb -U "$user" "$POSTGRES_DB"
    pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
  fi
fi
exec postgres -D "$PGDATA"
