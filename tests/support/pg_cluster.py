"""PostgreSQL clusters of a test's own: a primary and a streaming standby on free ports.

Made with the server's own tools (`initdb`, `pg_basebackup`, `pg_ctl`) under a temporary
directory; run as the `postgres` user when the test runs as root (initdb refuses root).
Trust authentication on 127.0.0.1 only; `fsync=off`: the test kills PostgreSQL, not the
machine, and a killed server's writes are in the OS's cache all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from tests.support.servers import free_port


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries under /usr/lib/postgresql")
    return found[-1]


@dataclass
class Cluster:
    name: str
    data: Path
    port: int

    async def admin(self) -> asyncpg.Connection:
        return await asyncpg.connect(host="127.0.0.1", port=self.port, user="postgres", database="postgres")


class Clusters:
    def __init__(self, home: Path, user: str | None) -> None:
        self.home = home
        self.user = user
        self.bin = _bin_dir()

    async def run(self, tool: str, *args: str) -> None:
        process = await asyncio.create_subprocess_exec(
            str(self.bin / tool),
            *args,
            user=self.user,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await process.communicate()
        if process.returncode != 0:
            raise RuntimeError(f"{tool} {' '.join(args)} failed: {out.decode(errors='replace')}")

    def _own(self, path: Path) -> None:
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(path, entry.pw_uid, entry.pw_gid)

    async def primary(self, *, synchronous: bool) -> Cluster:
        cluster = Cluster("primary", self.home / "primary", free_port())
        await self.run("initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust", "--no-sync")
        settings = {
            "port": cluster.port,
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.home}'",
            "wal_level": "replica",
            "max_wal_senders": 5,
            "fsync": "off",
            "shared_buffers": "'32MB'",
            "max_connections": 100,
            # Every standby confirms each commit before it is acknowledged (or none).
            "synchronous_standby_names": "'*'" if synchronous else "''",
        }
        await asyncio.to_thread(_append_conf, cluster.data, settings)
        await self.start(cluster)
        return cluster

    async def standby_of(self, primary: Cluster) -> Cluster:
        cluster = Cluster("standby", self.home / "standby", free_port())
        await self.run(
            "pg_basebackup", "-h", "127.0.0.1", "-p", str(primary.port), "-U", "postgres",
            "-D", str(cluster.data), "-R", "-X", "stream", "--no-sync",
        )  # fmt: skip
        # The copied postgresql.conf names synchronous standbys; promoted, this server has
        # none of its own and would wait for ever on every commit. (With Patroni, its
        # synchronous mode moves the setting along with the promotion.)
        standby_settings = {"port": cluster.port, "hot_standby": "on", "synchronous_standby_names": "''"}
        await asyncio.to_thread(_append_conf, cluster.data, standby_settings)
        await self.start(cluster)
        return cluster

    async def start(self, cluster: Cluster) -> None:
        log = self.home / f"{cluster.name}.log"
        await self.run("pg_ctl", "-D", str(cluster.data), "-l", str(log), "-w", "-t", "60", "start")

    async def kill(self, cluster: Cluster) -> None:
        """As a crash: every process of the server stops at once, no checkpoint."""
        await self.run("pg_ctl", "-D", str(cluster.data), "-m", "immediate", "-w", "stop")

    async def promote(self, cluster: Cluster) -> None:
        await self.run("pg_ctl", "-D", str(cluster.data), "-w", "-t", "60", "promote")

    async def stop_all(self) -> None:
        for data in (self.home / "primary", self.home / "standby"):
            if (data / "postmaster.pid").exists():
                with contextlib.suppress(RuntimeError):
                    await self.run("pg_ctl", "-D", str(data), "-m", "immediate", "-w", "stop")


def _append_conf(data: Path, settings: dict[str, object]) -> None:
    with (data / "postgresql.conf").open("a") as conf:
        for name, value in settings.items():
            conf.write(f"{name} = {value}\n")


@contextlib.asynccontextmanager
async def clusters() -> AsyncIterator[Clusters]:
    home = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="chatgate-clusters-"))
    user = "postgres" if os.geteuid() == 0 else None
    made = Clusters(home, user)
    made._own(home)
    try:
        yield made
    finally:
        await made.stop_all()
        await asyncio.to_thread(shutil.rmtree, home, True)


async def wait_for_sync_standby(primary: Cluster, timeout: float = 30) -> None:
    conn = await primary.admin()
    try:
        for _ in range(int(timeout / 0.1)):
            state = await conn.fetchval("SELECT sync_state FROM pg_stat_replication LIMIT 1")
            if state in ("sync", "quorum"):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"no synchronous standby after {timeout} s (state {state!r})")
    finally:
        await conn.close()


async def wait_for_replay(primary: Cluster, standby: Cluster, timeout: float = 30) -> None:
    """Until `standby` has replayed everything `primary` has written so far.

    Synchronous replication waits for the standby to flush a commit, not to apply it: a
    database just created on the primary may not exist yet on the standby a moment later.
    """
    on_primary = await primary.admin()
    on_standby = await standby.admin()
    try:
        written = await on_primary.fetchval("SELECT pg_current_wal_lsn()")
        replayed = None
        for _ in range(int(timeout / 0.05)):
            replayed = await on_standby.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", written)
            if replayed:
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"the standby did not replay up to {written} in {timeout} s")
    finally:
        await on_primary.close()
        await on_standby.close()
