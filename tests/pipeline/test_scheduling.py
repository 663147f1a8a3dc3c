"""Run slots and the hand-on of a slot (with a lease) from one key's worker to the next."""

from __future__ import annotations

import asyncio

from sqlalchemy import select

from app.db.models import session_keys
from app.events import InboundEvent
from app.pipeline.slots import RunSlots
from app.pipeline.storage.port import Claim
from app.sessions.lease import SessionLease
from tests.conftest import ServeApp
from tests.support.providers import RecordingProvider


def _claim(key: str) -> Claim:
    return Claim(SessionLease(key, "me", 1))


async def test_slots_go_in_line_and_a_picked_key_can_be_handed_a_claim_or_put_back() -> None:
    slots = RunSlots(1)
    mine = slots.try_take("mine")
    assert mine is not None
    waiters = {key: asyncio.create_task(slots.take(key)) for key in ("a", "b", "c")}
    await asyncio.sleep(0)
    assert slots.try_take("x") is None  # none free, and keys wait

    assert mine.pick() == "a"
    mine.put_back("a")  # the end did not give our lease up: "a" is still first
    assert mine.pick() == "a"
    mine.hand("a", _claim("a"))
    mine.release()  # handed on: nothing more to give back
    slot_a = await waiters["a"]
    assert slot_a.claim == _claim("a")

    waiters["b"].cancel()  # gone while waiting: out of line
    await asyncio.sleep(0)
    slot_a.release()  # "a" is done: the slot goes to "c", with nothing
    slot_c = await waiters["c"]
    assert slot_c.claim is None
    slot_c.release()
    slot_c.release()  # twice is once
    assert slots.try_take("x") is not None
    assert slots.try_take("y") is None


async def test_a_slot_handed_to_a_waiter_that_is_gone_goes_to_the_next() -> None:
    slots = RunSlots(1)
    mine = slots.try_take("mine")
    assert mine is not None
    gone = asyncio.create_task(slots.take("gone"))
    later = asyncio.create_task(slots.take("later"))
    await asyncio.sleep(0)
    assert mine.pick() == "gone"
    gone.cancel()
    await asyncio.sleep(0)
    mine.hand("gone", _claim("gone"))
    assert (await later).claim is None


async def test_keys_waiting_for_the_only_run_slot_all_run_in_turn(serve: ServeApp) -> None:
    """One run slot, four keys at once: the runs never overlap, each key is answered, and
    every lease is given up in the end (by a turn's end or its worker)."""
    provider = RecordingProvider(delay=0.1)
    async with serve(provider=provider, max_concurrent_runs=1) as srv:
        runtime = srv.runtime
        events = [InboundEvent.from_text("webhook", f"chat{i}", "u", f"m{i}") for i in range(4)]
        await asyncio.gather(*(runtime.ingest.submit([e]) for e in events))
        for event in events:
            result = await runtime.waiters.wait_for_replies(event.event_id, 10)
            assert result.done and result.replies[0].text == f"echo {event.text}"
        for _ in range(250):
            if not runtime.scheduler.busy_keys:
                break
            await asyncio.sleep(0.02)
        async with runtime.engine.connect() as conn:
            owners = (await conn.execute(select(session_keys.c.lease_owner))).scalars().all()
    assert provider.max_active == 1
    assert owners == [None] * 4
