"""The job store on both backends, with an injected clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app.scheduling import CronJob, InvalidSchedule, JobStore, Target

NOW = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)
TARGET = Target("webhook", "c1")


async def cron_job(jobs: JobStore, schedule: str = "*/5 * * * *", **kw: Any) -> CronJob:
    values: dict[str, Any] = dict(prompt="ping", source_session_key="webhook:c1", target=TARGET, now=NOW)
    values.update(kw)
    return await jobs.create(schedule=schedule, **values)


async def test_create_computes_the_first_fire_in_the_jobs_time_zone(jobs: JobStore) -> None:
    job = await cron_job(jobs, "0 9 * * *", timezone="Asia/Shanghai")
    assert job.next_fire_at == datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    assert (job.enabled, job.runs, job.one_shot, job.name) == (True, 0, False, "ping")
    assert await jobs.get(job.id) == job


async def test_create_refuses_bad_input_and_stores_nothing(jobs: JobStore) -> None:
    bad: list[dict[str, Any]] = [
        dict(schedule="61 * * * *"),
        dict(schedule="0 9 * * *", timezone="Nowhere/City"),
        dict(schedule="0 9 * * *", run_at=NOW + timedelta(hours=1)),
        dict(),
        dict(run_at=NOW - timedelta(seconds=1)),
        dict(run_at="next tuesday"),
        dict(schedule="0 9 * * *", prompt="   "),
        dict(schedule="0 9 * * *", target=Target("cron", "1")),
        dict(schedule="0 9 * * *", max_runs=0),
    ]
    for changes in bad:
        values: dict[str, Any] = dict(prompt="ping", source_session_key="webhook:c1", target=TARGET, now=NOW)
        values.update(changes)
        with pytest.raises(InvalidSchedule):
            await jobs.create(**values)
    assert await jobs.list_jobs() == []


async def test_due_returns_enabled_jobs_at_or_before_now(jobs: JobStore) -> None:
    soon = await jobs.create(
        prompt="a", source_session_key="k", target=TARGET, run_at=NOW + timedelta(minutes=1), now=NOW
    )
    later = await cron_job(jobs, "0 * * * *")  # 12:00
    off = await cron_job(jobs, "* * * * *", enabled=False)
    assert off.next_fire_at is None
    assert await jobs.due(NOW) == []
    assert [j.id for j in await jobs.due(NOW + timedelta(minutes=1))] == [soon.id]
    assert [j.id for j in await jobs.due(NOW + timedelta(hours=1))] == [soon.id, later.id]


async def test_claim_is_a_compare_and_set_on_the_due_time(jobs: JobStore) -> None:
    job = await cron_job(jobs)  # due 11:05
    [due] = await jobs.due(NOW + timedelta(minutes=5))
    results = await asyncio.gather(*(jobs.claim(due, NOW + timedelta(minutes=5)) for _ in range(5)))
    assert sorted(results) == [False, False, False, False, True]
    after = await jobs.get(job.id)
    assert after is not None
    assert after.next_fire_at == NOW + timedelta(minutes=10)
    assert after.last_fired_at == NOW + timedelta(minutes=5)
    assert after.runs == 1
    # A stale copy (read before the claim) claims nothing.
    assert await jobs.claim(due, NOW + timedelta(minutes=6)) is False


async def test_a_missed_fire_is_claimed_once_and_the_next_is_computed_from_now(jobs: JobStore) -> None:
    job = await cron_job(jobs, now=NOW - timedelta(days=30))  # due every 5 min for 30 days
    due = await jobs.due(NOW)
    assert [j.id for j in due] == [job.id]
    assert await jobs.claim(due[0], NOW) is True
    after = await jobs.get(job.id)
    assert after is not None
    assert after.next_fire_at == NOW + timedelta(minutes=5)
    assert after.runs == 1
    assert await jobs.due(NOW) == []


async def test_one_shot_and_max_runs_jobs_disable_themselves(jobs: JobStore) -> None:
    once = await jobs.create(
        prompt="a", source_session_key="k", target=TARGET, run_at=NOW + timedelta(minutes=1), now=NOW
    )
    assert once.one_shot and once.next_fire_at == NOW + timedelta(minutes=1)
    twice = await cron_job(jobs, "* * * * *", max_runs=2)
    t = NOW + timedelta(minutes=1)
    for job in await jobs.due(t):
        assert await jobs.claim(job, t)
    after_once = await jobs.get(once.id)
    assert after_once is not None
    assert (after_once.enabled, after_once.next_fire_at, after_once.runs) == (False, None, 1)
    t2 = NOW + timedelta(minutes=2)
    [job] = await jobs.due(t2)
    assert job.id == twice.id and await jobs.claim(job, t2)
    after_twice = await jobs.get(twice.id)
    assert after_twice is not None
    assert (after_twice.enabled, after_twice.next_fire_at, after_twice.runs) == (False, None, 2)
    with pytest.raises(InvalidSchedule, match="max_runs"):
        await jobs.set_enabled(twice.id, True, now=t2)
    raised = await jobs.update(twice.id, {"max_runs": 3, "enabled": True}, now=t2)
    assert raised is not None and raised.enabled and raised.next_fire_at == NOW + timedelta(minutes=3)


async def test_update_recomputes_the_next_fire_only_when_timing_changes(jobs: JobStore) -> None:
    job = await cron_job(jobs, "0 9 * * *")  # 09:00 UTC tomorrow
    later = NOW + timedelta(minutes=30)
    renamed = await jobs.update(job.id, {"prompt": "new text", "name": "daily"}, now=later)
    assert renamed is not None
    assert (renamed.prompt, renamed.name, renamed.next_fire_at) == ("new text", "daily", job.next_fire_at)
    moved = await jobs.update(job.id, {"timezone": "Asia/Shanghai"}, now=later)
    assert moved is not None and moved.next_fire_at == datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    one_shot = await jobs.update(job.id, {"run_at": "2026-12-24T18:00"}, now=later)
    assert one_shot is not None
    assert one_shot.schedule is None and one_shot.next_fire_at == datetime(2026, 12, 24, 10, 0, tzinfo=UTC)
    disabled = await jobs.set_enabled(job.id, False, now=later)
    assert disabled is not None and (disabled.enabled, disabled.next_fire_at) == (False, None)
    with pytest.raises(InvalidSchedule):
        await jobs.update(job.id, {"schedule": "not a cron"}, now=later)
    with pytest.raises(InvalidSchedule):
        await jobs.update(job.id, {"id": 5}, now=later)
    assert await jobs.update(9999, {"prompt": "x"}, now=later) is None


async def test_session_scoped_reads_and_deletes(jobs: JobStore) -> None:
    mine = await cron_job(jobs, source_session_key="webhook:a")
    theirs = await cron_job(jobs, source_session_key="webhook:b")
    assert [j.id for j in await jobs.list_jobs(source_session_key="webhook:a")] == [mine.id]
    assert await jobs.get(theirs.id, source_session_key="webhook:a") is None
    assert await jobs.delete(theirs.id, source_session_key="webhook:a") is False
    assert await jobs.get(theirs.id) is not None
    assert await jobs.count(source_session_key="webhook:a") == 1
    assert await jobs.delete(mine.id, source_session_key="webhook:a") is True
    assert await jobs.get(mine.id) is None
