"""A rolling restart loses nothing: SIGTERM hands a replica's work over at once.

Two real server processes on one PostgreSQL take a steady load; one is SIGTERMed in the
middle of it (turns in flight, leases held, replies claimed) and started again. The
stopping replica answers `/readyz` and new channel requests with 503 + `Retry-After`,
finishes its turns, gives its leases up and exits with status 0; every event is answered
exactly once, in order per conversation, and none waited anywhere near the lease TTL
(leases left to expire would have held their keys for 30 s).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter, defaultdict

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import inbox, outbox
from tests.conftest import WEBHOOK_SECRET
from tests.fakes.http_receiver import HttpReceiver, Received
from tests.pipeline.test_processes import _assert_legal_history, _env, _history, _wait_all_done
from tests.support.servers import ServerProcess, start_together, stop_all
from tests.support.webhook import post_webhook

# serial: it measures how long work waits around a restart; other workers' load would skew it.
pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.alone]

TTL = 30.0  # long: a hand-over that relied on the expiry would show as a 30 s wait
KEYS = 10
PER_KEY = 8


class Balancer:
    """What a load balancer does: the next live replica; a refused or failed request is
    sent again, with the same message id, to another one."""

    def __init__(self, urls: list[str]) -> None:
        self.urls = list(urls)
        self.refused: list[httpx.Response] = []  # 503s of a stopping replica

    async def send(self, client: httpx.AsyncClient, start: int, payload: dict[str, str]) -> str:
        for attempt in range(200):
            url = self.urls[(start + attempt) % len(self.urls)]
            try:
                resp = await post_webhook(client, url, WEBHOOK_SECRET, payload)
            except httpx.TransportError:  # the replica is gone
                await asyncio.sleep(0.05)
                continue
            if resp.status_code == 503:
                self.refused.append(resp)
                await asyncio.sleep(0.05)
                continue
            assert resp.status_code == 202, resp.text
            return str(resp.json()["event_id"])
        raise AssertionError(f"no replica took {payload}")


async def test_sigterm_mid_load_hands_everything_over_and_loses_nothing(pg_url: str) -> None:
    async with HttpReceiver() as receiver:
        env = _env(
            pg_url,
            OFFLINE_LATENCY_MS=600,
            LEASE_TTL_SECONDS=TTL,
            OUTBOX_CLAIM_SECONDS=TTL,
            SHUTDOWN_GRACE_SECONDS=15,
            WEBHOOK_CALLBACK_URL=receiver.url,
            OUTBOX_BACKOFF_BASE_SECONDS=0.2,
        )
        first, second = (await start_together({"first": env, "second": env})).values()
        balancer = Balancer([first.url, second.url])
        engine = create_async_engine(pg_url)
        sent: dict[str, list[str]] = defaultdict(list)  # key -> texts in send order
        events: dict[str, str] = {}  # event id -> key
        restarted: ServerProcess | None = None
        try:
            async with httpx.AsyncClient(timeout=30) as client:

                async def conversation(k: int) -> None:
                    for i in range(PER_KEY):
                        text = f"k{k} m{i}"
                        payload = {"chat_id": f"k{k}", "sender_id": "u", "text": text, "message_id": text}
                        events[await balancer.send(client, k + i, payload)] = f"webhook:k{k}"
                        sent[f"webhook:k{k}"].append(text)
                        await asyncio.sleep(0.25)

                load = asyncio.gather(*(conversation(k) for k in range(KEYS)))
                await _wait_all_done(engine, KEYS)  # turns are running on both replicas now

                first.terminate()
                signalled = time.monotonic()
                readiness = await _wait_refused(client, first.url)
                assert readiness.status_code == 503 and readiness.json()["status"] == "stopping"
                refused = await post_webhook(
                    client, first.url, WEBHOOK_SECRET, {"chat_id": "late", "sender_id": "u", "text": "x"}
                )
                assert refused.status_code == 503, refused.text
                assert refused.headers["Retry-After"].isdigit()
                assert refused.json()["error"] == "stopping"
                status = await asyncio.to_thread(first.wait, 20)
                stopped_after = time.monotonic() - signalled
                assert status == 0, first.log()
                assert stopped_after < 15, f"the hand-over took {stopped_after:.1f} s"

                restarted = await asyncio.to_thread(ServerProcess(env).start)
                balancer.urls = [restarted.url, second.url]
                await load
            await _wait_all_done(engine, len(events), timeout=60)
            received = await receiver.wait_for(len(events), timeout=60)
            # A reply's row is marked sent after the callback answered: wait for the marks.
            await _all_sent(engine, len(events))
            async with engine.connect() as conn:
                rows = (await conn.execute(select(outbox.c.event_id, outbox.c.status))).all()
                waited = (
                    await conn.execute(
                        select(func.max(outbox.c.sent_at - inbox.c.created_at)).join(
                            inbox, inbox.c.event_id == outbox.c.event_id
                        )
                    )
                ).scalar_one()
            histories = {key: await _history(engine, key) for key in sent}
        finally:
            await stop_all(*(server for server in (first, second, restarted) if server is not None))
            await engine.dispose()

    assert len(events) == KEYS * PER_KEY  # the refused "late" event was never stored
    by_event = Counter(json.loads(r.body)["event_id"] for r in received)
    assert set(by_event) == set(events), "a reply was lost"
    assert len({json.loads(r.body)["message_id"] for r in received}) == len(events)
    assert Counter(e for e, _ in rows) == Counter(events.keys())  # exactly one reply per event
    assert {s for _, s in rows} == {"sent"}
    for key, texts in sent.items():
        history = histories[key]
        _assert_legal_history(history)
        assert [(m["role"], m["content"]) for m in history] == [
            pair for t in texts for pair in (("user", t), ("assistant", f"You said: {t}"))
        ]
    assert waited.total_seconds() < TTL / 3, f"an event waited {waited} for its answer"


async def _wait_refused(client: httpx.AsyncClient, url: str) -> httpx.Response:
    """`/readyz` of a replica that got SIGTERM, once it says so (it keeps answering meanwhile)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        resp = await client.get(f"{url}/readyz")
        if resp.status_code != 200:
            return resp
        await asyncio.sleep(0.005)
    raise AssertionError("the replica stayed ready after SIGTERM")


async def test_sigkill_is_taken_over_within_the_lease_ttl_claims_included(pg_url: str) -> None:
    """A replica killed mid-load (turns running, replies being delivered) is taken over by
    the other within the lease TTL: its sessions all at once, its claimed deliveries too
    (not after OUTBOX_CLAIM_SECONDS, 30 s here); each event answered exactly once."""
    ttl = 3.0
    # The callback answers slowly: deliveries are in flight, their rows claimed, at the kill.
    async with HttpReceiver(delay=0.5) as receiver:
        env = _env(
            pg_url,
            OFFLINE_LATENCY_MS=300,
            LEASE_TTL_SECONDS=ttl,
            OUTBOX_CLAIM_SECONDS=30,
            WEBHOOK_CALLBACK_URL=receiver.url,
            OUTBOX_BACKOFF_BASE_SECONDS=0.2,
        )
        first, second = await asyncio.gather(
            asyncio.to_thread(ServerProcess(env).start), asyncio.to_thread(ServerProcess(env).start)
        )
        engine = create_async_engine(pg_url)
        events: dict[str, str] = {}
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for i in range(60):
                    target = first if i % 2 == 0 else second
                    body = {"chat_id": f"k{i % 20}", "sender_id": "u", "text": f"m{i}"}
                    resp = await post_webhook(client, target.url, WEBHOOK_SECRET, body)
                    assert resp.status_code == 202
                    events[resp.json()["event_id"]] = f"webhook:k{i % 20}"
            await _wait_all_done(engine, 10)
            first.kill()
            killed = time.monotonic()
            await _wait_all_done(engine, len(events), timeout=60)
            received = await _every_reply(receiver, set(events))
            await _all_sent(engine, len(events))  # a reply the dead replica had claimed, too
            took = time.monotonic() - killed
            async with engine.connect() as conn:
                rows = (await conn.execute(select(outbox.c.event_id, outbox.c.status))).all()
        finally:
            first.kill()
            await stop_all(second)
            await engine.dispose()
    assert {json.loads(r.body)["event_id"] for r in received} == set(events), "a reply was lost"
    # A delivery in flight at the kill may arrive twice (at least once), with its one id.
    assert len({json.loads(r.body)["message_id"] for r in received}) == len(events)
    assert Counter(e for e, _ in rows) == Counter(events.keys())
    assert {s for _, s in rows} == {"sent"}
    # The lease TTL, then the remaining work of one replica (60 events, 300 ms each, over 20
    # keys, 0.5 s per delivery): far below the 30 s a claim used to hold a reply up.
    assert took < ttl + 12, f"the dead replica's work was done {took:.1f} s after the kill"


async def _every_reply(receiver: HttpReceiver, events: set[str], timeout: float = 60) -> list[Received]:
    """What the callback received once it has a reply for every event (some maybe twice)."""
    deadline = time.monotonic() + timeout
    count = len(events)
    while True:
        received = await receiver.wait_for(count, timeout=max(0.1, deadline - time.monotonic()))
        if {json.loads(r.body)["event_id"] for r in received} >= events:
            return received
        assert time.monotonic() < deadline, "a reply was lost"
        count = len(received) + 1


async def _all_sent(engine: AsyncEngine, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        async with engine.connect() as conn:
            query = select(func.count()).select_from(outbox).where(outbox.c.status == "sent")
            sent = (await conn.execute(query)).scalar_one()
        if sent >= count:
            return
        assert time.monotonic() < deadline, f"only {sent} of {count} replies sent"
        await asyncio.sleep(0.1)
