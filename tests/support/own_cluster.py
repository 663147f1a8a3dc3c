"""A PostgreSQL cluster of a test's own: for measurements that are cluster-wide.

`pg_stat_wal` counts the WAL flushes of the whole cluster, so on the shared server any
other work (another engineer's tests, another xdist worker) is counted as the test's.
A cluster started for one test sees only that test's commits. It uses the server
binaries of the installed PostgreSQL (`initdb`, `pg_ctl`: on PATH or Debian's
/usr/lib/postgresql/<version>/bin) and runs them as `postgres` when we are root, since
PostgreSQL refuses to run as root.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.timing import scaled

__all__ = ["own_cluster"]


def _binary(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))[-1:]), None
    )
    if not found:
        raise RuntimeError(f"PostgreSQL server binary {name!r} not found (install the postgresql package)")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def own_cluster() -> Iterator[str]:
    """Start a fresh cluster (trust auth, durable commits as configured by default); its URL."""
    as_root = os.geteuid() == 0
    run_as = ["runuser", "-u", "postgres", "--"] if as_root else []
    root = Path(tempfile.mkdtemp(prefix="chatgate-own-pg-"))
    if as_root:
        shutil.chown(root, "postgres", "postgres")
    data = root / "data"
    port = _free_port()
    subprocess.run(
        [*run_as, _binary("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"],
        check=True,
        capture_output=True,
        timeout=scaled(120),
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=on"
    pg_ctl = _binary("pg_ctl")
    subprocess.run(
        [
            *run_as,
            pg_ctl,
            "-D",
            str(data),
            "-o",
            options,
            "-l",
            str(root / "log"),
            "-w",
            "-t",
            str(int(scaled(60))),
            "start",
        ],
        check=True,
        capture_output=True,
        timeout=scaled(90),
    )
    try:
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=scaled(60),
        )
        shutil.rmtree(root, ignore_errors=True)
