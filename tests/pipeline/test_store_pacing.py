"""The storage port's pacing operations (`take_pace`, `pause_pace`, `pace_paused`), on
every store: slots spaced by each bucket's interval, shared by two engines as by two
replicas, `retry_after` pauses, and previews yielding to final answers."""

from __future__ import annotations

import asyncio

from sqlalchemy import select, text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import create_engine
from app.db.models import pacing_buckets
from app.pipeline.storage import build_store
from app.pipeline.storage.port import PipelineStore
from app.pipeline.storage.postgres import PostgresStore
from app.pipeline.storage.records import PaceBucket, PaceGrant, PaceTake
from app.sessions.store import Lifecycle, SessionStore
from tests.conftest import make_settings
from tests.pipeline.conftest import store_kind
from tests.support.timing import eventually

T0 = 1_800_000_000.0  # unix seconds: the tests give the clock, so nothing here sleeps
CHAT = PaceBucket("telegram:chat:-100", 1.0)
GROUP = PaceBucket("telegram:group:-100", 3.0)
BOT = PaceBucket("telegram:bot", 0.5)


def final(now: float, *buckets: PaceBucket, within: float = 100.0) -> PaceTake:
    return PaceTake(buckets or (BOT, CHAT, GROUP), now=now, within=within)


def preview(now: float) -> PaceTake:
    return PaceTake((BOT, CHAT, GROUP), now=now, within=0.0, preview=True)


async def test_final_answers_take_slots_spaced_by_the_slowest_bucket(store: PipelineStore) -> None:
    first = await store.take_pace(final(T0))
    # Another chat of the same bot only shares the bot bucket (one per 0.5 s).
    other = await store.take_pace(final(T0, BOT, PaceBucket("telegram:chat:7", 1.0)))
    assert (first.granted, first.at, other.granted, other.at) == (True, T0, True, T0 + 0.5)
    grants = [await store.take_pace(final(T0)) for _ in range(3)]
    assert all(g.granted for g in grants)
    assert [g.at - T0 for g in grants] == [3.0, 6.0, 9.0]  # the group: one per 3 s
    # Long after, the buckets are free again: now, not a backlog of missed slots.
    later = await store.take_pace(final(T0 + 100))
    assert later.granted and later.at == T0 + 100


async def test_a_slot_too_far_away_is_not_taken_but_told(store: PipelineStore) -> None:
    assert (await store.take_pace(final(T0, within=1.0))).granted
    refused = await store.take_pace(final(T0 + 0.5, within=1.0))
    assert (refused.granted, refused.at) == (False, T0 + 3.0)
    # Refusing took nothing: the one coming back then gets that very slot.
    back = await store.take_pace(final(T0 + 3.0, within=1.0))
    assert (back.granted, back.at) == (True, T0 + 3.0)


async def test_a_pause_holds_every_bucket_it_names_and_only_grows(store: PipelineStore) -> None:
    names = [CHAT.name, GROUP.name]
    assert await store.pace_paused(names) == 0.0
    await store.pause_pace(names, T0 + 3.0)
    await store.pause_pace(names, T0 + 1.0)  # an earlier end does not shorten it
    assert await store.pace_paused(names) == T0 + 3.0
    assert await store.pace_paused([BOT.name]) == 0.0
    grant = await store.take_pace(final(T0))
    assert (grant.granted, grant.at) == (True, T0 + 3.0)
    # The bot bucket alone (another chat) is not paused.
    other = await store.take_pace(final(T0, PaceBucket("telegram:chat:7", 1.0)))
    assert (other.granted, other.at) == (True, T0)


async def test_previews_go_only_when_idle_and_no_final_answer_waits(store: PipelineStore) -> None:
    assert (await store.take_pace(preview(T0))).granted
    assert not (await store.take_pace(preview(T0 + 1))).granted  # the group's slot is taken
    assert (await store.take_pace(preview(T0 + 6))).granted  # idle a whole interval since
    # A final answer takes its slot; previews keep off while it is recent.
    assert (await store.take_pace(final(T0 + 20, within=1.0))).granted
    assert not (await store.take_pace(preview(T0 + 21))).granted
    # Over budget: a final refused for later keeps previews off until it is back, even
    # once the buckets would be free.
    assert (await store.take_pace(final(T0 + 23, within=1.0))).granted  # slot T0+23
    refused = await store.take_pace(final(T0 + 23.5, within=1.0))
    assert (refused.granted, refused.at) == (False, T0 + 26.0)
    assert not (await store.take_pace(preview(T0 + 25.9))).granted
    assert (await store.take_pace(final(T0 + 26, within=1.0))).granted  # the final goes first
    assert not (await store.take_pace(preview(T0 + 27))).granted
    assert (await store.take_pace(preview(T0 + 32))).granted


async def test_two_replicas_never_take_the_same_slot(store: PipelineStore, db_url: str, backend: str) -> None:
    engine = create_engine(make_settings(db_url, db_pool_size=4))
    other = build_store(engine, SessionStore(engine, Lifecycle()), lease_ttl=30.0, kind=store_kind(backend))
    # Four at a time from each: racing all the same, without 40 connections at once on a
    # cluster the suite's other workers share (`max_connections` is 100).
    lanes = {id(store): asyncio.Semaphore(4), id(other): asyncio.Semaphore(4)}

    async def take(s: PipelineStore, bucket: PaceBucket) -> PaceGrant:
        async with lanes[id(s)]:
            return await s.take_pace(final(T0, bucket))

    try:
        bucket = PaceBucket("slack:chat:C1", 0.25)
        grants = await asyncio.gather(*(take(s, bucket) for _ in range(20) for s in (store, other)))
    finally:
        await engine.dispose()
    slots = sorted(g.at for g in grants)
    assert all(g.granted for g in grants)
    assert slots == [T0 + 0.25 * i for i in range(40)]  # each once, none closer than the interval


async def test_idle_buckets_are_pruned_and_come_back_fresh(store: PipelineStore) -> None:
    assert (await store.take_pace(final(T0, CHAT))).granted  # next_free T0+1
    await store.pause_pace([GROUP.name], T0 + 50)
    assert await store.prune_pace(T0 + 10) == 1  # the chat's; the group is paused past it
    assert await store.pace_paused([GROUP.name]) == T0 + 50
    again = await store.take_pace(final(T0 + 10, CHAT))
    assert (again.granted, again.at) == (True, T0 + 10)
    assert await store.prune_pace(T0 + 100) == 2


async def test_a_chat_has_one_final_answer_in_flight_until_it_is_answered(store: PipelineStore) -> None:
    chat = PaceBucket("telegram:chat:-200", 0.05, exclusive=True)
    bot = PaceBucket("telegram:bot", 0.01)

    def send(now: float) -> PaceTake:
        return PaceTake((bot, chat), now=now, within=1.0, hold=30.0)

    first = await store.take_pace(send(T0))
    assert (first.granted, first.at, first.held_until) == (True, T0, T0 + 30.0)
    # Its slot's interval is over, but its answer has not come: the next asks again soon.
    busy = await store.take_pace(send(T0 + 0.2))
    assert (busy.granted, busy.busy) == (False, True) and T0 + 0.2 < busy.at <= T0 + 0.3
    # A preview keeps off as well, and another chat of the bot is not held.
    assert not (await store.take_pace(PaceTake((bot, chat), now=T0 + 10, within=0.0, preview=True))).granted
    other = PaceBucket("telegram:chat:7", 0.05, exclusive=True)
    assert (await store.take_pace(PaceTake((bot, other), now=T0 + 0.2, within=1.0, hold=30.0))).granted
    # Answered (after its `retry_after` was recorded): the next goes.
    await store.release_pace([chat.name], first.held_until)
    second = await store.take_pace(send(T0 + 0.3))
    assert (second.granted, second.at) == (True, T0 + 0.3)
    # A sender that died holds the chat no longer than `hold`; its late release does not
    # free the chat from the send that took it over.
    third = await store.take_pace(send(T0 + 31))
    assert third.granted
    await store.release_pace([chat.name], second.held_until)
    assert (await store.take_pace(send(T0 + 31.5))).busy
    await store.release_pace([chat.name], third.held_until)
    assert (await store.take_pace(send(T0 + 31.5))).granted


async def test_a_release_and_a_take_of_the_same_chat_on_two_replicas_both_go_through(
    pg_store: PostgresStore, pg_url: str
) -> None:
    """One replica releases a chat's exclusive buckets (its answer came) while the other
    takes them for the next answer, both queued behind a third transaction holding the
    first of them. When it ends both must go through: PostgreSQL aborted one of them as a
    deadlock while the release locked the rows in the order it met them, not by name."""
    first = pg_store
    engines = [create_engine(make_settings(pg_url)) for _ in range(2)]  # the other replica, a blocker
    second = PostgresStore(engines[0], SessionStore(engines[0], Lifecycle()), lease_ttl=30)
    chat = PaceBucket("telegram:chat:-300", 0.05, exclusive=True)
    group = PaceBucket("telegram:group:-300", 0.05, exclusive=True)
    try:
        held = await first.take_pace(PaceTake((chat, group), now=T0, within=1.0, hold=30.0))
        assert held.granted
        # The chat's row written last: a scan of the table meets the group's row first.
        await first.pause_pace([chat.name], T0 + 0.01)
        async with engines[1].connect() as blocker:
            await blocker.execute(
                select(pacing_buckets.c.name).where(pacing_buckets.c.name == chat.name).with_for_update()
            )
            take = asyncio.create_task(
                second.take_pace(PaceTake((chat, group), now=T0 + 31, within=1.0, hold=30.0))
            )
            await _waiting_for_locks(engines[1], 1)
            release = asyncio.create_task(first.release_pace([chat.name, group.name], held.held_until))
            await _waiting_for_locks(engines[1], 2)
            await blocker.rollback()
        granted = await take
        await release
    finally:
        for engine in engines:
            await engine.dispose()
    assert granted.granted


async def _waiting_for_locks(engine: AsyncEngine, count: int) -> None:
    """Until `count` other sessions of this database wait for a lock."""
    query = text(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )

    async def waiting() -> bool:
        async with engine.connect() as conn:
            return bool((await conn.execute(query)).scalar_one() >= count)

    await eventually(waiting, timeout=10)
