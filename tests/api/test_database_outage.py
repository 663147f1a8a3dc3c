"""The database cut off mid-load (a TCP proxy between chatgate and PostgreSQL): 503s
with a JSON body and Retry-After, one log line per outage, and recovery without a
restart in which every event acknowledged before the outage is answered."""

from __future__ import annotations

import asyncio

import httpx
from aiohttp import web
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine
from structlog.testing import capture_logs

from app.api.app import create_app
from app.db.models import outbox
from app.events import InboundEvent
from app.pipeline.replies import outbox_values, reply_for
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, make_settings, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.servers import serve_in_loop
from tests.support.tcp_proxy import TcpProxy, tcp_proxy, via_proxy
from tests.support.webhook import post_webhook

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _replied(client: httpx.AsyncClient, url: str, chat: str) -> int:
    """How many assistant answers the chat's session holds (admin API)."""
    r = await client.get(f"{url}/admin/api/sessions/webhook:{chat}/messages", headers=ADMIN)
    if r.status_code == 404:
        return 0
    r.raise_for_status()
    return sum(1 for m in r.json()["messages"] if m["role"] == "assistant")


async def test_outage_answers_503_with_retry_after_and_recovers_by_itself(pg_url: str) -> None:
    async with tcp_proxy("127.0.0.1", 5432) as proxy:
        settings = make_settings(
            via_proxy(pg_url, proxy),
            offline_latency_ms=150,  # turns still running when the database goes away
            db_connect_timeout_seconds=2,
            db_outage_retry_after_seconds=7,
        )
        app = create_app(settings, channel_settings={"webhook": webhook_settings()})
        async with serve_in_loop(app) as srv, httpx.AsyncClient(timeout=30) as client:
            acknowledged: list[str] = []
            for i in range(12):
                chat = f"c{i % 4}"
                r = await post_webhook(
                    client,
                    srv.url,
                    WEBHOOK_SECRET,
                    {"chat_id": chat, "sender_id": "u", "text": f"m{i}", "message_id": f"m{i}"},
                )
                assert r.status_code == 202, r.text
                acknowledged.append(chat)

            with capture_logs() as logs:
                proxy.block()
                refused = []
                for i in range(5):
                    r = await post_webhook(
                        client,
                        srv.url,
                        WEBHOOK_SECRET,
                        {"chat_id": "c9", "sender_id": "u", "text": f"o{i}", "message_id": f"o{i}"},
                    )
                    refused.append(r)
                admin = await client.get(f"{srv.url}/admin/api/sessions", headers=ADMIN)
                assert (await client.get(f"{srv.url}/readyz")).status_code == 503
                assert (await client.get(f"{srv.url}/metrics")).status_code == 200  # not blind
                for r in [*refused, admin]:
                    assert r.status_code == 503, (r.status_code, r.text)
                    assert r.headers["retry-after"] == "7"
                    assert r.headers["content-type"].startswith("application/json")
                    assert r.json()["error"] == "database_unavailable"

                proxy.unblock()
                # The sender retries with the same ids, as the 503 says: now accepted.
                for i in range(5):
                    payload = {"chat_id": "c9", "sender_id": "u", "text": f"o{i}", "message_id": f"o{i}"}
                    for _ in range(100):
                        r = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload)
                        if r.status_code != 503:
                            break
                        await asyncio.sleep(0.1)
                    assert r.status_code == 202, r.text
                    assert r.json().get("duplicate") is not True  # a 503 stored nothing
                    acknowledged.append("c9")
                for _ in range(100):
                    if any(e["event"] == "database_reachable_again" for e in logs):
                        break
                    await asyncio.sleep(0.1)

            unreachable = [e for e in logs if e["event"] == "database_unreachable"]
            assert len(unreachable) == 1, [e["event"] for e in logs]
            [back] = [e for e in logs if e["event"] == "database_reachable_again"]
            assert back["refused_requests"] >= 6
            assert not [e for e in logs if e.get("exc_info")], "no traceback per request"

            # Every event acknowledged before (and after) the outage is answered, once.
            expected = {chat: acknowledged.count(chat) for chat in set(acknowledged)}
            for _ in range(300):
                got = {chat: await _replied(client, srv.url, chat) for chat in expected}
                if got == expected:
                    break
                await asyncio.sleep(0.1)
            assert got == expected


class _CutsTheDatabaseOff(HttpReceiver):
    """A webhook callback target that takes the database away as it receives a reply:
    the delivery has happened, its result cannot be recorded."""

    def __init__(self, proxy: TcpProxy) -> None:
        super().__init__()
        self.proxy = proxy

    async def _handle(self, request: web.Request) -> web.Response:
        self.proxy.block()
        return await super()._handle(request)


async def test_a_delivery_during_an_outage_is_recorded_when_the_database_is_back(
    pg_url: str, pg_engine: AsyncEngine
) -> None:
    """Not left claimed for OUTBOX_CLAIM_SECONDS and then sent a second time."""
    async with tcp_proxy("127.0.0.1", 5432) as proxy, _CutsTheDatabaseOff(proxy) as receiver:
        settings = make_settings(
            via_proxy(pg_url, proxy),
            bus_database_url=pg_url,  # only the sender's statements go through the proxy
            outbox_poll_seconds=60,  # the test drives the sender itself
            inbox_poll_seconds=60,
            outbox_claim_seconds=60,
            db_connect_timeout_seconds=2,
        )
        channels = {"webhook": webhook_settings(callback_url=receiver.url)}
        app = create_app(settings, channel_settings=channels)
        async with serve_in_loop(app) as srv:
            sender = srv.runtime.sender
            reply = reply_for(InboundEvent.from_text("webhook", "c1", "u", "hi"), "the answer")
            async with pg_engine.begin() as conn:
                await conn.execute(
                    outbox.insert(), outbox_values(reply, session_id=None, run_id=None, event_id=None)
                )
            delivering = asyncio.create_task(sender.deliver_due())
            await receiver.wait_for(1)
            for _ in range(200):  # the result's write finds the database away, and tries again
                if proxy.refused or delivering.done():
                    break
                await asyncio.sleep(0.02)
            assert not delivering.done(), "the result was given up: the row stays claimed, then is sent again"
            assert proxy.refused
            proxy.unblock()
            assert await asyncio.wait_for(delivering, 10) == 1
        async with pg_engine.connect() as conn:
            [row] = (await conn.execute(select(outbox.c.status, outbox.c.attempts))).all()
        assert (row.status, row.attempts) == ("sent", 1)
        assert len(receiver.received) == 1
