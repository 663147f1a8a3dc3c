"""A multi-host DATABASE_URL (`?host=a:p&host=b:q&target_session_attrs=read-write`) is
honoured by the pool, the migrations, the session bus and `doctor`, and the bus follows
the hosts when the one it is on goes away."""

from __future__ import annotations

import asyncio
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import make_url
from structlog.testing import capture_logs

from app.config import Settings
from app.db.engine import create_engine
from app.doctor import doctor
from app.migrate import current_revision, head_revision, upgrade
from app.pg_bus import PgSessionBus
from tests.conftest import make_settings
from tests.support.servers import free_port
from tests.support.tcp_proxy import tcp_proxy


def multi_host(url: str, *ports: int, attrs: str = "read-write") -> str:
    """`url` (one local database) reached through the given local ports, in order."""
    base = make_url(url)
    hosts = "&".join(f"host=127.0.0.1:{port}" for port in ports)
    auth = base.username or "postgres"
    return f"postgresql+asyncpg://{auth}@/{base.database}?{hosts}&target_session_attrs={attrs}"


async def _next(queue: asyncio.Queue[dict[str, Any]], timeout: float = 10.0) -> dict[str, Any]:
    return await asyncio.wait_for(queue.get(), timeout)


async def test_pool_migrations_and_doctor_take_every_host(pg_url: str) -> None:
    url = multi_host(pg_url, free_port(), 5432)  # the first host refuses: the second is used
    await upgrade(url)
    engine = create_engine(make_settings(url))
    try:
        async with engine.connect() as conn:
            assert (await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar() is False
        assert await current_revision(engine) == head_revision(url)
    finally:
        await engine.dispose()
    checks = {c.name: c for c in await doctor(make_settings(url, llm_provider="offline"))}
    assert checks["database"].ok and checks["schema"].ok, checks
    # The test server has no standby: doctor says so, as a pass.
    assert checks["replication"].ok and not checks["replication"].warning
    assert checks["replication"].detail.startswith("no standby")


async def test_bus_follows_the_hosts_and_resyncs(pg_url: str, pg_engine: Any) -> None:
    async with tcp_proxy("127.0.0.1", 5432) as first, tcp_proxy("127.0.0.1", 5432) as second:
        url = multi_host(pg_url, first.port, second.port)
        a = PgSessionBus(pg_url)
        b = PgSessionBus(url, reconnect_delay=0.1)
        await a.start()
        await b.start()
        try:
            async with b.subscribe("web:k") as on_b:
                await a.publish("web:k", {"i": 1})
                assert await _next(on_b) == {"i": 1}
                first.block()  # the host the bus is on dies: it must go on through the second
                assert await _next(on_b) == {"type": "resync", "session_key": "web:k"}
                assert b._listen_conn is not None
                assert b._listen_conn._addr[1] == second.port  # type: ignore[attr-defined]
                await a.publish("web:k", {"i": 2})
                assert await _next(on_b) == {"i": 2}
        finally:
            await a.stop()
            await b.stop()


async def test_bus_without_a_matching_host_retries_instead_of_failing(pg_url: str, pg_engine: Any) -> None:
    """Every listed host a standby (as during a failover): asyncpg raises
    `TargetServerAttributeNotMatched`, an `InternalClientError`; the bus keeps trying."""
    url = multi_host(pg_url, 5432, attrs="standby")
    bus = PgSessionBus(url, reconnect_delay=0.05)
    with capture_logs() as logs:
        await bus.start()  # raised out of `chatgate serve` before
        try:
            for _ in range(100):
                if sum(e["event"] == "bus_reconnect_failed" for e in logs) >= 2:
                    break
                await asyncio.sleep(0.05)
        finally:
            await bus.stop()
    failed = [e for e in logs if e["event"] in ("bus_listen_connect_failed", "bus_reconnect_failed")]
    assert len(failed) >= 2, logs


def test_pgbouncer_without_a_direct_bus_url_is_refused() -> None:
    from app.doctor import database_settings_problem

    pooled = make_settings("postgresql://u@127.0.0.1:6432/db", database_pooler="pgbouncer")
    problem = database_settings_problem(pooled)
    assert problem is not None and "BUS_DATABASE_URL" in problem and "\n" not in problem
    direct = make_settings(
        "postgresql://u@127.0.0.1:6432/db",
        database_pooler="pgbouncer",
        bus_database_url="postgresql://u@127.0.0.1:5432/db",
    )
    assert database_settings_problem(direct) is None
    assert direct.bus_url == "postgresql+asyncpg://u@127.0.0.1:5432/db"
    assert isinstance(direct, Settings)
