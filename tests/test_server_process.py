"""The tests' server processes (tests/support/servers.py): a server that another test
worker's server beat to its port must not take that server's /readyz for its own."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from tests.support import servers
from tests.support.db import sqlite_database
from tests.support.servers import ServerProcess, stop_all

pytestmark = pytest.mark.slow


async def test_a_port_another_server_took_is_not_mistaken_for_ours(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with sqlite_database(tmp_path) as db_url:
        await _two_servers_one_port(
            {"DATABASE_URL": db_url, "CHANNELS": "webhook", "WEBHOOK_SECRET": "s"}, monkeypatch
        )


async def _two_servers_one_port(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    first = await asyncio.to_thread(ServerProcess(env).start)
    try:
        picks = iter([first.port])  # the next pick is the port the first server holds
        real = servers.free_port
        monkeypatch.setattr(servers, "free_port", lambda: next(picks, None) or real())
        second = ServerProcess(env)
        assert second.port == first.port
        await asyncio.to_thread(second.start)
        try:
            assert second.port != first.port, "took the other server's /readyz for its own"
            assert second.proc is not None and second.proc.poll() is None
            async with httpx.AsyncClient(timeout=10) as client:
                assert (await client.get(f"{second.url}/readyz")).status_code == 200
        finally:
            await stop_all(second)
    finally:
        await stop_all(first)


def test_kept_ports_are_below_the_ports_the_kernel_hands_out_and_never_twice() -> None:
    lowest_ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [servers.kept_port() for _ in range(3)]
    assert len(set(picked)) == 3
    assert all(port < lowest_ephemeral for port in picked)
    assert all(port != servers.free_port() for port in picked for _ in range(20))
