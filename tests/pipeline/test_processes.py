"""Real server processes: ordering across replicas on one PostgreSQL, and SIGKILL recovery.

These start `python -m app serve` as subprocesses and talk to them over HTTP only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import inbox, messages, outbox, runs, sessions
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.fakes.http_receiver import HttpReceiver
from tests.pipeline.conftest import store_kind
from tests.support.servers import ServerProcess, start_together, stop_all
from tests.support.timing import scaled
from tests.support.webhook import post_webhook

pytestmark = pytest.mark.slow


def _env(db_url: str, **extra: object) -> dict[str, str]:
    env = {
        "DATABASE_URL": db_url,
        "WEBHOOK_SECRET": WEBHOOK_SECRET,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "webhook",
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


async def _wait_all_done(engine: AsyncEngine, expected: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + scaled(timeout)
    while time.monotonic() < deadline:
        async with engine.connect() as conn:
            done = (
                await conn.execute(select(func.count()).select_from(inbox).where(inbox.c.status == "done"))
            ).scalar_one()
        if done >= expected:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"only {done} of {expected} events done")


async def _history(engine: AsyncEngine, key: str) -> list[dict]:
    async with engine.connect() as conn:
        rows = (
            (
                await conn.execute(
                    select(messages)
                    .join(sessions, sessions.c.id == messages.c.session_id)
                    .where(sessions.c.key == key)
                    .order_by(messages.c.seq)
                )
            )
            .mappings()
            .all()
        )
    return [dict(r) for r in rows]


def _assert_legal_history(history: list[dict]) -> None:
    """Dense seqs; every tool call answered exactly once, right after its call."""
    assert [m["seq"] for m in history] == list(range(1, len(history) + 1))
    i = 0
    while i < len(history):
        msg = history[i]
        assert msg["role"] != "tool", f"orphan tool result at seq {msg['seq']}"
        if msg["role"] == "assistant" and msg["tool_calls"]:
            ids = sorted(tc["id"] for tc in msg["tool_calls"])
            results = history[i + 1 : i + 1 + len(ids)]
            assert sorted(r["tool_call_id"] for r in results if r["role"] == "tool") == ids, msg
            i += 1 + len(ids)
        else:
            i += 1


async def test_two_processes_keep_one_sessions_order(pg_url: str) -> None:
    env = _env(pg_url, OFFLINE_LATENCY_MS=150)
    first, second = (await start_together({"first": env, "second": env})).values()
    engine = create_async_engine(pg_url)
    try:
        async with httpx.AsyncClient(timeout=30) as client:
            for i in range(10):  # alternate the replica that accepts each event
                target = first if i % 2 == 0 else second
                resp = await post_webhook(
                    client, target.url, WEBHOOK_SECRET, {"chat_id": "one", "sender_id": "u", "text": f"m{i}"}
                )
                assert resp.status_code == 202
        await _wait_all_done(engine, 10)
        history = await _history(engine, "webhook:one")
    finally:
        await stop_all(first, second)
        await engine.dispose()
    # History order equals acceptance order, each answer right after its question.
    assert [(m["role"], m["content"]) for m in history] == [
        pair for i in range(10) for pair in (("user", f"m{i}"), ("assistant", f"You said: m{i}"))
    ]


@pytest.mark.alone
@pytest.mark.serial  # a wall-time bound: other workers' load would eat the parallelism it measures
async def test_two_processes_run_different_sessions_in_parallel(pg_url: str) -> None:
    env = _env(pg_url, OFFLINE_LATENCY_MS=200)
    servers = list((await start_together({"first": env, "second": env})).values())
    engine = create_async_engine(pg_url)
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            started = time.monotonic()
            replies = await asyncio.gather(
                *(
                    post_webhook(
                        client,
                        servers[i % 2].url,
                        WEBHOOK_SECRET,
                        {"chat_id": f"s{i}", "sender_id": "u", "text": "hi"},
                        wait=True,
                    )
                    for i in range(40)
                )
            )
            elapsed = time.monotonic() - started
        async with engine.connect() as conn:
            spans = (await conn.execute(select(runs.c.started_at, runs.c.finished_at))).all()
    finally:
        await stop_all(*servers)
        await engine.dispose()
    assert all(r.status_code == 200 and r.json()["replies"] for r in replies)
    assert elapsed < 40 * 0.2 * 0.75, f"{elapsed:.1f}s for 40 sessions (serial: 8 s)"
    overlap = max(sum(1 for s, f in spans if s <= t < f) for t, _ in spans)
    assert overlap >= 6, f"at most {overlap} runs overlapped"


@pytest.mark.parametrize("kill_after_done", [2])
async def test_sigkill_mid_run_loses_nothing(db_url: str, backend: str, kill_after_done: int) -> None:
    async with HttpReceiver() as receiver:
        env = _env(
            db_url,
            PIPELINE_STORE=store_kind(backend),
            OFFLINE_LATENCY_MS=300,
            LEASE_TTL_SECONDS=2,
            WEBHOOK_CALLBACK_URL=receiver.url,
            OUTBOX_BACKOFF_BASE_SECONDS=0.2,
            OUTBOX_CLAIM_SECONDS=2,  # a delivery the killed process had claimed is retried soon
        )
        server = ServerProcess(env).start()
        engine = create_async_engine(db_url)
        events: dict[str, str] = {}
        try:
            async with httpx.AsyncClient(timeout=30) as client:
                for i in range(12):
                    text = "what time is it?" if i % 3 == 0 else f"message {i}"
                    resp = await post_webhook(
                        client,
                        server.url,
                        WEBHOOK_SECRET,
                        {"chat_id": f"k{i % 3}", "sender_id": "u", "text": text},
                    )
                    assert resp.status_code == 202
                    events[resp.json()["event_id"]] = f"webhook:k{i % 3}"
            await _wait_all_done(engine, kill_after_done)
            server.kill()  # SIGKILL in the middle of the work
            async with engine.connect() as conn:
                unfinished = (
                    await conn.execute(
                        select(func.count()).select_from(inbox).where(inbox.c.status != "done")
                    )
                ).scalar_one()
            assert unfinished > 0, "the kill came too late to interrupt anything"

            restarted = ServerProcess(env).start()
            try:
                await _wait_all_done(engine, len(events))
                # Every event's reply, by id: a redelivered reply counts once, so the wait
                # cannot end on N receipts while a distinct reply is still on its way.
                received = await receiver.wait_until(
                    lambda got: {json.loads(r.body)["event_id"] for r in got} >= set(events), timeout=60
                )
            finally:
                await stop_all(restarted)

            by_event = Counter(json.loads(r.body)["event_id"] for r in received)
            assert set(by_event) == set(events), "a reply was lost"
            unique_messages = {json.loads(r.body)["message_id"] for r in received}
            assert len(unique_messages) == len(events)  # redelivery, if any, carries the same id
            async with engine.connect() as conn:
                rows = (await conn.execute(select(outbox.c.event_id, outbox.c.status))).all()
            assert Counter(e for e, _ in rows) == Counter(events.keys())  # exactly one reply per event
            assert {s for _, s in rows} == {"sent"}
            for key in set(events.values()):
                history = await _history(engine, key)
                _assert_legal_history(history)
                user_events = [m["event_id"] for m in history if m["role"] == "user"]
                assert sorted(user_events) == sorted(e for e, k in events.items() if k == key)
        finally:
            server.kill()
            await engine.dispose()
