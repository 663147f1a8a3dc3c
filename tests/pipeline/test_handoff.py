"""PostgreSQL: a worker whose turn's end releases its key hands its run slot to the next key.

The releasing statement also takes the next waiting key's free lease and reads its rows
(`fused.finish(successor=)`); the dispatcher hands the slot over with them
(`app.pipeline.slots`), so that key starts without a statement to take its lease.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import asyncpg
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import utcnow
from app.errors import LeaseLost
from app.events import InboundEvent
from app.pipeline import fused, prefetch
from app.pipeline.inbox import Inbox
from app.pipeline.slots import RunSlots
from app.sessions import lease as leases
from app.sessions.lease import SessionLease
from tests.conftest import ServeApp
from tests.pipeline.test_fused import ANSWERED, _start, _with_session, finish
from tests.pipeline.test_lease_fusion import KEY, _sql, accepts_taking, lease_of
from tests.support.pg_probe import asyncpg_dsn, statements
from tests.support.providers import RecordingProvider

NEXT = "webhook:next"


def _next_in_line() -> fused.Successor:
    return fused.Successor(NEXT, utcnow() + timedelta(seconds=30))


async def _accept(engine: AsyncEngine, chat: str, text: str) -> str:
    [accepted] = await Inbox(engine).accept([InboundEvent.from_text("webhook", chat, "u", text)])
    return accepted.event_id


# --- the statement --------------------------------------------------------------------


async def test_a_releasing_end_takes_the_next_keys_free_lease_and_reads_its_rows(
    pg_engine: AsyncEngine,
) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    waiting = [await _accept(pg_engine, "next", text) for text in ("one", "two", "three")]
    started = await _start(pg_engine, lease, row_id)

    done = await finish(pg_engine, lease, started, row_id, "hi", release=True, successor=_next_in_line())

    assert done.released and await lease_of(pg_engine, KEY) == (None, lease.fence)
    assert done.successor == SessionLease(NEXT, "me", 1)  # a new key: its row is created
    assert await lease_of(pg_engine, NEXT) == ("me", 1)
    assert [r.event_id for r in done.successor_rows] == waiting[: prefetch.LIMIT]


async def test_a_key_with_rows_left_keeps_its_lease_and_takes_no_other(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    await _accept(pg_engine, "next", "waiting")
    started = await _start(pg_engine, lease, row_id)
    await _accept(pg_engine, "c", "more for this key")

    done = await finish(pg_engine, lease, started, row_id, "hi", release=True, successor=_next_in_line())

    assert not done.released and done.successor is None
    assert await lease_of(pg_engine, KEY) == ("me", lease.fence)
    assert await lease_of(pg_engine, NEXT) is None  # not even its row


async def test_a_next_key_held_elsewhere_is_not_taken_and_ours_is_released(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    assert await leases.acquire(pg_engine, NEXT, "other", ttl=30) is not None
    started = await _start(pg_engine, lease, row_id)

    done = await finish(pg_engine, lease, started, row_id, "hi", release=True, successor=_next_in_line())

    assert done.released and done.successor is None and done.successor_rows is None
    assert await lease_of(pg_engine, NEXT) == ("other", 1)


async def test_a_next_key_whose_row_is_locked_is_skipped_not_waited_for(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """Two replicas handing on to each other's keys must not wait for each other's row locks."""
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    assert (held := await leases.acquire(pg_engine, NEXT, "other", ttl=30)) is not None
    assert await leases.release(pg_engine, held) is False  # free again, its row exists
    started = await _start(pg_engine, lease, row_id)
    other = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        async with other.transaction():  # e.g. the other replica's statement on that key
            await other.execute("SELECT 1 FROM session_keys WHERE key = $1 FOR UPDATE", NEXT)
            done = await asyncio.wait_for(
                finish(pg_engine, lease, started, row_id, "hi", release=True, successor=_next_in_line()), 5
            )
    finally:
        await other.close()

    assert done.released and done.successor is None
    assert await lease_of(pg_engine, NEXT) == (None, 1)  # left alone: it takes its lease itself


async def test_a_lost_lease_hands_nothing_on(pg_engine: AsyncEngine) -> None:
    _, lease, row_id = await _with_session(pg_engine, *ANSWERED)
    started = await _start(pg_engine, lease, row_id)
    later = utcnow() + timedelta(seconds=31)
    assert await leases.acquire(pg_engine, KEY, "thief", ttl=30, now=later) is not None

    with pytest.raises(LeaseLost):
        await finish(pg_engine, lease, started, row_id, "hi", release=True, successor=_next_in_line())

    assert await lease_of(pg_engine, NEXT) is None


# --- the slots ------------------------------------------------------------------------


async def test_slots_go_in_line_and_a_picked_key_can_be_handed_a_value_or_put_back() -> None:
    slots: RunSlots[str] = RunSlots(1)
    assert slots.try_take()
    waiters = {key: asyncio.create_task(slots.take(key)) for key in ("a", "b", "c")}
    await asyncio.sleep(0)
    assert not slots.try_take()  # none free, and keys wait

    assert slots.pick() == "a"
    slots.put_back("a")  # its statement did not release ours: "a" is still first
    assert slots.pick() == "a"
    assert slots.hand("a", "a's lease")
    assert await waiters["a"] == "a's lease"

    waiters["b"].cancel()  # gone while waiting: out of line
    await asyncio.sleep(0)
    slots.release()  # "a" is done: the slot goes to "c", with nothing
    assert await waiters["c"] is None
    slots.release()
    assert slots.try_take()  # free again


async def test_a_slot_handed_to_a_waiter_that_is_gone_goes_to_the_next() -> None:
    slots: RunSlots[str] = RunSlots(1)
    assert slots.try_take()
    gone = asyncio.create_task(slots.take("gone"))
    later = asyncio.create_task(slots.take("later"))
    await asyncio.sleep(0)
    assert slots.pick() == "gone"
    gone.cancel()
    await asyncio.sleep(0)
    assert not slots.hand("gone", "lease")
    assert await later is None


# --- served ---------------------------------------------------------------------------


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_keys_waiting_for_the_only_run_slot_start_with_the_lease_their_predecessor_took(
    serve: ServeApp,
) -> None:
    """One run slot, four keys at once: the first takes its lease on accept, and each turn's
    end takes the next key's. No statement of its own takes or releases a lease, and the
    runs never overlap."""
    provider = RecordingProvider(delay=0.1)
    async with serve(provider=provider, max_concurrent_runs=1) as srv:
        events = [InboundEvent.from_text("webhook", f"chat{i}", "u", f"m{i}") for i in range(4)]
        with statements(srv.runtime.engine) as seen:
            await asyncio.gather(*(srv.runtime.inbox.accept([e]) for e in events))
            for event in events:
                result = await srv.runtime.inbox.wait_for_replies(event.event_id, 10)
                assert result.done and result.replies[0].text == f"echo {event.parts[0].text}"  # type: ignore[union-attr]
        assert provider.max_active == 1
        assert accepts_taking(srv, seen) == 1
        assert _sql(srv, prefetch.TAKE) not in seen
        assert _sql(srv, leases._RELEASE["postgresql"]) not in seen
        assert seen.count(_sql(srv, fused.FINISH[True])) == 3  # the last one had nobody waiting
        for event in events:
            assert await lease_of(srv.runtime.engine, event.session_key) == (None, 1)
