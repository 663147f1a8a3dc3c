"""A real PgBouncer (Debian's `pgbouncer` package) in transaction mode, started by a test.

It refuses to run as root: as root the test runs it as the `postgres` user. The config
lives in a directory of its own, on a free port, pooling every database of the local
PostgreSQL server with trust authentication and a few server connections only, so that
clients share them (what breaks named prepared statements).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg

from tests.support.servers import free_port

PGBOUNCER = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"


def _configure(server_connections: int) -> tuple[Path, int, str | None]:
    """Its directory (config, auth file, log), its port, and the user to run it as."""
    home = Path(tempfile.mkdtemp(prefix="chatgate-pgbouncer-"))
    port = free_port()
    (home / "users.txt").write_text('"postgres" ""\n')
    (home / "pgbouncer.ini").write_text(
        "[databases]\n"
        "* = host=127.0.0.1 port=5432\n"
        "[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {home / 'users.txt'}\n"
        f"pool_mode = transaction\ndefault_pool_size = {server_connections}\nmax_client_conn = 500\n"
        f"logfile = {home / 'pgbouncer.log'}\n"
        "ignore_startup_parameters = extra_float_digits,application_name\n"
    )
    if os.geteuid() != 0:
        return home, port, None
    entry = pwd.getpwnam("postgres")
    for path in (home, *home.iterdir()):
        os.chown(path, entry.pw_uid, entry.pw_gid)
    return home, port, "postgres"


@contextlib.asynccontextmanager
async def pgbouncer(*, server_connections: int = 3) -> AsyncIterator[int]:
    """A PgBouncer in transaction mode in front of 127.0.0.1:5432; yields its port."""
    home, port, user = await asyncio.to_thread(_configure, server_connections)
    process = await asyncio.create_subprocess_exec(PGBOUNCER, str(home / "pgbouncer.ini"), user=user)
    try:
        for _ in range(100):
            try:
                conn = await asyncpg.connect(
                    host="127.0.0.1", port=port, user="postgres", database="postgres", statement_cache_size=0
                )
            except (OSError, asyncpg.PostgresError):
                if process.returncode is not None:
                    raise RuntimeError("pgbouncer exited; see its log in " + str(home)) from None
                await asyncio.sleep(0.1)
                continue
            await conn.close()
            break
        else:
            raise RuntimeError("pgbouncer did not start listening")
        yield port
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()
        shutil.rmtree(home, ignore_errors=True)
