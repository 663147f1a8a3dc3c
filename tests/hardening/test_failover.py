"""A primary failover under load loses no acknowledged event with synchronous replication.

The test makes its own primary and hot standby (`tests.support.pg_cluster`: initdb,
pg_basebackup, synchronous_standby_names = '*'), serves chatgate with the multi-host URL
(`?host=primary&host=standby&target_session_attrs=read-write`), sends events as a
platform does (retrying with the same id on a 503 or a dropped connection), kills the
primary (an immediate shutdown: no checkpoint, every backend gone at once) after a
third of them were acknowledged, and promotes the standby. Every acknowledged event
must be on the new primary and answered; chatgate finds the new primary by itself.
"""

from __future__ import annotations

import asyncio
import time

import asyncpg
import httpx
import pytest

from app.api.app import create_app
from app.doctor import doctor
from tests.conftest import WEBHOOK_SECRET, make_settings, webhook_settings
from tests.support.pg_cluster import Cluster, clusters, wait_for_replay, wait_for_sync_standby
from tests.support.servers import serve_in_loop
from tests.support.webhook import post_webhook

# Serial: it runs two PostgreSQL servers of its own and kills one of them under load.
pytestmark = [pytest.mark.serial, pytest.mark.alone]

EVENTS = 300
CHATS = 30
KILL_AFTER = 100  # acknowledged events before the primary is killed


def multi_host_url(*servers: Cluster, database: str) -> str:
    hosts = "&".join(f"host=127.0.0.1:{server.port}" for server in servers)
    return f"postgresql+asyncpg://postgres@/{database}?{hosts}&target_session_attrs=read-write"


async def test_failover_to_a_synchronous_standby_loses_no_acknowledged_event() -> None:
    started = time.monotonic()
    async with asyncio.timeout(150), clusters() as made:
        primary = await made.primary(synchronous=True)
        standby = await made.standby_of(primary)
        await wait_for_sync_standby(primary)
        admin = await primary.admin()
        await admin.execute("CREATE DATABASE chatgate")
        await admin.close()
        await wait_for_replay(primary, standby)  # the database exists on the standby too

        settings = make_settings(
            multi_host_url(primary, standby, database="chatgate"),
            db_connect_timeout_seconds=2,
            db_outage_retry_after_seconds=1,
        )
        app = create_app(settings, channel_settings={"webhook": webhook_settings()})
        # `doctor` on the same URL sees the synchronous standby; on the standby alone, refuses it.
        checks = await doctor(settings)
        found = [c for c in checks if c.name == "replication"]
        assert len(found) == 1, checks
        replication = found[0]
        assert replication.ok and not replication.warning, replication
        assert replication.detail.startswith("synchronous standby walreceiver")
        on_standby = make_settings(f"postgresql://postgres@127.0.0.1:{standby.port}/chatgate")
        [wrong] = [c for c in await doctor(on_standby) if c.name == "replication"]
        assert not wrong.ok and wrong.detail.startswith("connected to a standby")
        acknowledged: set[str] = set()
        enough = asyncio.Event()
        refused = 0

        async with serve_in_loop(app) as srv, httpx.AsyncClient(timeout=30) as client:
            room = asyncio.Semaphore(10)

            async def send(n: int) -> None:
                """As a platform: until acknowledged, again with the same id."""
                nonlocal refused
                payload = {
                    "chat_id": f"f{n % CHATS}",
                    "sender_id": "u",
                    "text": f"event {n}",
                    "message_id": f"e{n}",
                }
                async with room:
                    while True:
                        try:
                            r = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload)
                        except httpx.HTTPError:
                            r = None
                        # A duplicate is an acknowledgement too: the attempt before was stored
                        # but its answer lost (the connection died with the commit on its way).
                        if r is not None and (r.status_code == 202 or r.json().get("duplicate") is True):
                            acknowledged.add(f"msg:e{n}")
                            if len(acknowledged) >= KILL_AFTER:
                                enough.set()
                            return
                        assert r is None or r.status_code == 503, (r.status_code, r.text)
                        refused += 1
                        await asyncio.sleep(0.2)  # the 503's Retry-After, shortened

            load = asyncio.gather(*(send(n) for n in range(EVENTS)))
            await enough.wait()
            await made.kill(primary)
            await made.promote(standby)
            await asyncio.wait_for(load, 90)
            assert len(acknowledged) == EVENTS
            # The session bus followed to the new primary by itself.
            bus = app.state.runtime.bus
            for _ in range(100):
                listening = bus._listen_conn
                if listening is not None and not listening.is_closed() and listening._addr[1] == standby.port:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("the session bus did not reconnect to the promoted standby")

            # On the new primary: every acknowledged event, each handled to its end.
            db = await asyncpg.connect(
                host="127.0.0.1", port=standby.port, user="postgres", database="chatgate"
            )
            try:
                rows: list[asyncpg.Record] = []
                for _ in range(600):
                    rows = await db.fetch("SELECT external_id, status FROM inbox WHERE channel = 'webhook'")
                    if sum(r["status"] == "done" for r in rows) >= EVENTS:
                        break
                    await asyncio.sleep(0.1)
                lost = acknowledged - {r["external_id"] for r in rows}
                assert lost == set(), f"{len(lost)} acknowledged events lost"
                assert {r["status"] for r in rows} == {"done"}
                answers = await db.fetchval(
                    "SELECT count(*) FROM messages m JOIN sessions s ON s.id = m.session_id"
                    " WHERE s.key LIKE 'webhook:%' AND m.role = 'assistant'"
                )
                assert answers >= EVENTS
            finally:
                await db.close()
    assert refused > 0, "the failover was not noticed: the test did not test it"
    assert time.monotonic() - started < 120
