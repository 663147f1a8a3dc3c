"""The cron channel end to end: fires land on the source session, replies reach the target.

Real servers on both backends; the target chat is a webhook channel whose callback URL
points at a recording HTTP server, so the test sees what a platform would receive.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import cron_jobs, inbox, outbox, utcnow
from app.migrate import upgrade
from app.runtime import Runtime
from app.scheduling import Target
from channels.cron import CronChannel, CronSettings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, make_settings, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.timing import eventually
from tests.support.webhook import post_webhook

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def cron_settings(**overrides: Any) -> CronSettings:
    values: dict[str, Any] = {"tick_seconds": 0.05, **overrides}
    return CronSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def cron_inbox_rows(runtime: Runtime) -> list[Any]:
    async with runtime.engine.connect() as conn:
        rows = await conn.execute(select(inbox).where(inbox.c.channel == "cron").order_by(inbox.c.id))
        return list(rows.mappings().all())


async def test_job_fires_into_its_source_session_and_the_reply_reaches_the_target(serve: ServeApp) -> None:
    async with HttpReceiver() as receiver:
        channels = {"webhook": webhook_settings(callback_url=receiver.url), "cron": cron_settings()}
        async with serve(channel_settings=channels) as srv, httpx.AsyncClient(timeout=30) as client:
            first = await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": "c1", "sender_id": "u1", "text": "hello"}
            )
            assert first.status_code == 202
            await receiver.wait_for(1)

            job = await srv.runtime.jobs.create(
                prompt="stand-up starts soon",
                source_session_key="webhook:c1",
                target=Target("webhook", "c1"),
                run_at=utcnow() + timedelta(seconds=0.3),
            )
            delivered = await receiver.wait_for(2)
            reply = json.loads(delivered[1].body)
            assert reply["text"] == "You said: stand-up starts soon"
            assert reply["chat_id"] == "c1"
            assert reply["session_key"] == "webhook:c1"

            # The fire is a turn of the source conversation, after the earlier one.
            hist = await client.get(f"{srv.url}/admin/api/sessions/webhook%3Ac1/messages", headers=ADMIN)
            assert [(m["role"], m["content"]) for m in hist.json()["messages"]] == [
                ("user", "hello"),
                ("assistant", "You said: hello"),
                ("user", "stand-up starts soon"),
                ("assistant", "You said: stand-up starts soon"),
            ]
            [row] = await cron_inbox_rows(srv.runtime)
            assert row["session_key"] == "webhook:c1"
            assert row["external_id"] == f"cron:{job.id}:{job.run_at.isoformat()}"  # type: ignore[union-attr]
            assert row["payload"]["metadata"]["cron_job_id"] == job.id
            assert reply["event_id"] == row["event_id"]

            # A one-shot job disables itself after its fire.
            after = await srv.runtime.jobs.get(job.id)
            assert after is not None
            assert (after.enabled, after.runs, after.next_fire_at) == (False, 1, None)
            assert after.last_fired_at is not None
            # A second one-shot job is the barrier: once it fired, later ticks ran, and the
            # first job fired no more.
            barrier = await srv.runtime.jobs.create(
                prompt="barrier",
                source_session_key="webhook:c1",
                target=Target("webhook", "c1"),
                run_at=utcnow() + timedelta(seconds=0.2),
            )
            await receiver.wait_for(3)
            rows = await cron_inbox_rows(srv.runtime)
            assert [r["payload"]["metadata"]["cron_job_id"] for r in rows] == [job.id, barrier.id]
            assert len(receiver.received) == 3


async def test_reply_goes_to_the_target_thread_and_lands_on_an_explicit_session(serve: ServeApp) -> None:
    async with HttpReceiver() as receiver:
        channels = {"webhook": webhook_settings(callback_url=receiver.url), "cron": cron_settings()}
        async with serve(channel_settings=channels) as srv:
            await srv.runtime.jobs.create(
                prompt="weekly report",
                source_session_key="team-report",
                target=Target("webhook", "room-7", "thread-3"),
                run_at=utcnow() + timedelta(seconds=0.2),
            )
            [got] = await receiver.wait_for(1)
            body = json.loads(got.body)
            assert (body["chat_id"], body["thread_id"], body["session_key"]) == (
                "room-7",
                "thread-3",
                "team-report",
            )


async def test_a_fire_missed_during_downtime_runs_once_on_start(serve: ServeApp) -> None:
    async with HttpReceiver() as receiver:
        webhook = webhook_settings(callback_url=receiver.url)
        # A monthly job missed about ten fires while no scheduler ran. (Monthly, so that no
        # regular fire can fall inside the test and blur "once".)
        async with serve(channel_settings={"webhook": webhook}) as srv:
            job = await srv.runtime.jobs.create(
                prompt="ping",
                source_session_key="webhook:ops",
                target=Target("webhook", "ops"),
                schedule="0 0 1 * *",
                now=utcnow() - timedelta(days=300),
            )
        assert job.next_fire_at is not None and job.next_fire_at < utcnow() - timedelta(days=250)

        async with serve(channel_settings={"webhook": webhook, "cron": cron_settings()}) as srv:
            await receiver.wait_for(1)
            # A one-shot job due a few ticks later is the barrier: still one fire of the
            # missed job after it.
            barrier = await srv.runtime.jobs.create(
                prompt="barrier",
                source_session_key="webhook:ops",
                target=Target("webhook", "ops"),
                run_at=utcnow() + timedelta(seconds=0.3),
            )
            await receiver.wait_for(2)
            rows = await cron_inbox_rows(srv.runtime)
            assert [r["payload"]["metadata"]["cron_job_id"] for r in rows] == [job.id, barrier.id]
            assert rows[0]["external_id"] == f"cron:{job.id}:{job.next_fire_at.isoformat()}"
            after = await srv.runtime.jobs.get(job.id)
            assert after is not None and after.next_fire_at is not None
            now = utcnow()
            assert now < after.next_fire_at <= now + timedelta(days=31)
            assert (after.next_fire_at.day, after.next_fire_at.hour) == (1, 0)
            assert after.runs == 1 and after.enabled
        assert len(receiver.received) == 2


async def _two_runtimes(pg_url: str, tick: float) -> tuple[Runtime, Runtime]:
    await upgrade(make_settings(pg_url).database_url)
    return tuple(  # type: ignore[return-value]
        Runtime(
            make_settings(pg_url, worker_id=name),
            channel_settings={"webhook": webhook_settings(), "cron": cron_settings(tick_seconds=tick)},
        )
        for name in ("replica-a", "replica-b")
    )


async def test_two_runtimes_on_one_database_fire_each_due_job_exactly_once(pg_url: str) -> None:
    a, b = await _two_runtimes(pg_url, tick=0.01)
    long_ago = utcnow() - timedelta(days=90)
    jobs = [
        await a.jobs.create(
            prompt=f"job {i}",
            source_session_key=f"webhook:c{i}",
            target=Target("webhook", f"c{i}"),
            schedule="0 0 1 * *",  # monthly: the next regular fire is far outside the test
            now=long_ago,
        )
        for i in range(20)
    ]
    async with a, b:

        async def all_answered() -> bool:
            async with a.engine.connect() as conn:
                sent = (await conn.execute(select(outbox.c.status))).scalars().all()
            return len(sent) >= len(jobs) and all(s == "sent" for s in sent)

        await eventually(all_answered)
        # A one-shot job due later is the barrier: by its answer both replicas ticked many
        # more times, and no job fired twice.
        barrier = await a.jobs.create(
            prompt="barrier",
            source_session_key="webhook:barrier",
            target=Target("webhook", "barrier"),
            run_at=utcnow() + timedelta(seconds=0.2),
        )
        jobs.append(barrier)
        await eventually(all_answered)
        rows = await cron_inbox_rows(a)
        async with a.engine.connect() as conn:
            replies = (await conn.execute(select(outbox.c.chat_id))).scalars().all()
            runs = dict((await conn.execute(select(cron_jobs.c.id, cron_jobs.c.runs))).all())
    assert sorted(r["payload"]["metadata"]["cron_job_id"] for r in rows) == sorted(j.id for j in jobs)
    assert sorted(replies) == sorted([*(f"c{i}" for i in range(20)), "barrier"])
    assert runs == {j.id: 1 for j in jobs}


async def test_concurrent_ticks_with_the_same_clock_claim_each_fire_once(pg_url: str) -> None:
    a, b = await _two_runtimes(pg_url, tick=3600)  # ticks only when the test says so
    async with a, b:
        # Due next New Year: the tickers' own (real-clock) ticks never see them due.
        jobs = [
            await a.jobs.create(
                prompt=f"job {i}",
                source_session_key=f"webhook:c{i}",
                target=Target("webhook", f"c{i}"),
                schedule="0 0 1 1 *",
            )
            for i in range(10)
        ]
        assert jobs[0].next_fire_at is not None
        now = jobs[0].next_fire_at + timedelta(minutes=1)
        cron_a, cron_b = a.adapters["cron"], b.adapters["cron"]
        assert isinstance(cron_a, CronChannel) and isinstance(cron_b, CronChannel)
        fires_a, fires_b = await asyncio.gather(cron_a.tick(now), cron_b.tick(now))
        fires = fires_a + fires_b
        assert sorted(f.job_id for f in fires if not f.duplicate) == [j.id for j in jobs]
        assert sorted(f.job_id for f in fires if f.claimed) == [j.id for j in jobs]
        # The same instant again: nothing is due any more.
        assert await cron_a.tick(now) == [] and await cron_b.tick(now) == []
        # At the next fire each job is due once more, and fires once more.
        claimed = await a.jobs.get(jobs[0].id)
        assert claimed is not None and claimed.next_fire_at is not None
        assert claimed.next_fire_at.year == now.year + 1
        next_year = claimed.next_fire_at + timedelta(minutes=1)
        later = await asyncio.gather(cron_a.tick(next_year), cron_b.tick(next_year))
        assert sorted(f.job_id for f in later[0] + later[1] if not f.duplicate) == [j.id for j in jobs]
        assert len(await cron_inbox_rows(a)) == 20
