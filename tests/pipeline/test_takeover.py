"""A replica that died mid-run: its session is taken over once its lease expires."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select

from app.db.models import inbox, outbox, runs, session_keys, utcnow
from app.events import InboundEvent
from app.pipeline.storage.portable import inbox_values
from app.sessions import lease as leases
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, text
from tests.pipeline.test_approvals import history_is_legal, rows
from tests.pipeline.test_steer import inbox_rows, send
from tests.support.timing import eventually


async def test_expired_lease_of_a_dead_replica_is_taken_over_and_counted(serve: ServeApp) -> None:
    async with serve(lease_ttl_seconds=5) as srv, httpx.AsyncClient(timeout=30) as client:
        runtime = srv.runtime
        # A dead replica held the key and left an event unfinished.
        async with runtime.engine.begin() as conn:
            # What the dead replica accepted before dying.
            event = InboundEvent.from_text("webhook", "c", "u", "left behind")
            await conn.execute(inbox.insert().values(**inbox_values(event, utcnow())))
            await conn.execute(
                session_keys.insert().values(
                    key="webhook:c",
                    lease_owner="dead-replica",
                    lease_fence=7,
                    lease_expires_at=utcnow() - timedelta(seconds=1),
                )
            )
        # The poller finds the key, takes the expired lease and answers.
        for _ in range(100):
            detail = await client.get(
                f"{srv.url}/admin/api/sessions/webhook%3Ac",
                headers={"Authorization": "Bearer test-admin-token"},
            )
            if detail.status_code == 200 and detail.json()["message_count"] == 2:
                break
            await asyncio.sleep(0.1)
        assert detail.json()["message_count"] == 2
        assert detail.json()["lease"]["fence"] == 8
        metrics = (await client.get(f"{srv.url}/metrics")).text
        assert "chatgate_lease_takeovers_total 1.0" in metrics


async def test_a_turn_whose_lease_was_taken_over_during_the_model_call_writes_nothing(
    serve: ServeApp,
) -> None:
    """The end of a turn (answer, outbox row, inbox status, run trace) is fenced as one.

    The lease is taken over while the model thinks; the late answer must leave no trace.
    Once the key is free again the event is retried and answered exactly once.
    """
    hold = asyncio.Event()
    async with FakeOpenAI(default=text("answer after the retry")) as fake:
        fake.enqueue(text("first answer"), Reply(content="late answer", hold=hold))
        async with serve(**openai_settings(fake)) as srv:
            engine = srv.runtime.engine
            await send(srv, "first", wait=True)  # the session exists: a turn's common start
            second = await send(srv, "second")
            await fake.wait_requests(2)
            key = (await inbox_rows(srv))[0]["session_key"]
            # Another replica takes the key over (its clock is past this worker's lease).
            later = utcnow() + timedelta(seconds=srv.runtime.settings.lease_ttl_seconds + 1)
            intruder = await leases.acquire(engine, key, "another-replica", ttl=30, now=later)
            assert intruder is not None
            hold.set()

            async def worker_gave_up() -> bool:
                return key not in srv.runtime.scheduler.busy_keys

            await eventually(worker_gave_up)
            written = await history_is_legal(srv, key)
            assert [m.content for m in written] == ["first", "first answer", "second"]
            async with engine.connect() as conn:
                replies = (await conn.execute(select(outbox.c.payload))).scalars().all()
            assert [p["parts"][0]["text"] for p in replies] == ["first answer"]
            ibx = await inbox_rows(srv)
            assert [r["status"] for r in ibx] == ["done", "processing"]
            assert [r["outcome"] for r in await rows(srv, runs)] == ["ok", "running"]

            # The other replica lets go without finishing: the event is retried here.
            await leases.release(engine, intruder)
            answered = await srv.runtime.waiters.wait_for_replies(second["event_id"], 10)
            assert [r.text for r in answered.replies] == ["answer after the retry"]
            assert [m.content for m in await history_is_legal(srv, key)] == [
                "first",
                "first answer",
                "second",
                "answer after the retry",
            ]
            assert [r["outcome"] for r in await rows(srv, runs)] == ["ok", "crashed", "ok"]


@pytest.mark.alone
@pytest.mark.serial  # counts keys queued at one moment: a loaded machine's stalls upset it
async def test_all_of_a_dead_replicas_sessions_are_reclaimed_in_one_sweep(serve: ServeApp) -> None:
    """A busy survivor frees every expired lease of a dead replica in one poll, not one key
    per poll: they all queue for its run slots at once and are all answered."""
    count = 12
    async with (
        serve(
            lease_ttl_seconds=5, max_concurrent_runs=1, inbox_poll_seconds=0.5, offline_latency_ms=200
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        runtime = srv.runtime
        async with runtime.engine.begin() as conn:
            for i in range(count):
                event = InboundEvent.from_text("webhook", f"dead{i}", "u", f"left behind {i}")
                await conn.execute(inbox.insert().values(**inbox_values(event, utcnow())))
                await conn.execute(
                    session_keys.insert().values(
                        key=f"webhook:dead{i}",
                        lease_owner="dead-replica",
                        lease_fence=3,
                        lease_expires_at=utcnow() - timedelta(seconds=1),
                    )
                )
        dead_owned = select(session_keys.c.key).where(session_keys.c.lease_owner == "dead-replica")
        for _ in range(200):
            async with runtime.engine.connect() as conn:
                left = (await conn.execute(dead_owned)).all()
            if not left:
                break
            await asyncio.sleep(0.02)
        assert not left
        # The sweep's statement commits before its keys are queued: wait for the queueing.
        await eventually(lambda: bool(runtime.scheduler.busy_keys), timeout=2)
        # One slot and 200 ms turns: taking one key per poll would leave most of them held
        # by the dead replica for several polls still.
        queued_at_once = len(runtime.scheduler.busy_keys)
        assert queued_at_once >= count - 2, f"only {queued_at_once} of {count} keys queued at once"
        await eventually(_all_done(runtime, count), timeout=30)
        metrics = (await client.get(f"{srv.url}/metrics")).text
    assert f"chatgate_lease_takeovers_total {float(count)}" in metrics


def _all_done(runtime: Any, count: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        async with runtime.engine.connect() as conn:
            done = (
                await conn.execute(select(func.count()).select_from(inbox).where(inbox.c.status == "done"))
            ).scalar_one()
        return bool(done == count)

    return check
