"""The storage port's ingest and leases, on every store (`backend`): the same answers everywhere.

What a store may read "for free" (the key's next rows with a lease) is optional; when it
is there, it must be exactly what a read would return.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from sqlalchemy import update

from app.db.models import session_keys, utcnow
from app.pipeline.storage.port import PipelineStore
from app.sessions.lease import SessionLease
from tests.pipeline.support import KEY, accept, event, lease_of, state, turn


async def test_events_are_stored_in_order_and_a_redelivery_is_told_the_original(store: PipelineStore) -> None:
    first = event("one", external_id="m1")
    accepted = await store.accept([first, event("two", external_id="m2")])
    assert [r.duplicate for r in accepted.results] == [False, False]
    again = await store.accept([event("one again", external_id="m1")])
    assert again.results[0].duplicate and again.results[0].event_id == first.event_id
    rows = await store.next_rows(KEY, 10)
    assert [r.event.text for r in rows] == ["one", "two"]
    assert all(r.attempts == 0 for r in rows)


async def test_single_events_arriving_together_are_each_stored_once(store: PipelineStore) -> None:
    """Many single accepts at once (PostgreSQL stores such a burst with one statement)."""
    copies = [event("same", external_id="dup") for _ in range(3)]
    others = [event(f"m{i}", chat=f"c{i}") for i in range(20)]
    results = await asyncio.gather(*(store.accept([e]) for e in [*others[:10], *copies, *others[10:]]))
    told = [a.results[0] for a in results]
    assert sum(not r.duplicate for r in told) == 21
    originals = {r.event_id for r in told[10:13]}
    assert len(originals) == 1 and [r.duplicate for r in told[10:13]].count(False) == 1
    assert len((await state(store))["inbox"]) == 21


async def test_an_event_is_not_done_until_handled_and_then_has_its_replies(store: PipelineStore) -> None:
    [event_id] = await accept(store, "hello")
    assert await store.replies_if_done(event_id) is None
    lease = await lease_of(store)
    await turn(store, lease, "hi there")
    done = await store.replies_if_done(event_id)
    assert done is not None and done.done and [r.text for r in done.replies] == ["hi there"]


async def test_a_lease_is_one_owners_and_an_expired_one_is_taken_over(store: PipelineStore) -> None:
    await accept(store, "hello")
    first = await store.take(KEY, "a")
    assert first is not None and not first.lease.took_over
    assert await store.take(KEY, "b") is None
    assert await store.renew(first.lease)
    async with store.sessions.engine.begin() as conn:
        await conn.execute(update(session_keys).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
    taken = await store.take(KEY, "b")
    assert taken is not None and taken.lease.took_over and taken.lease.fence > first.lease.fence
    assert not await store.renew(first.lease)  # fenced out


async def test_rows_that_come_with_a_lease_are_the_keys_next_rows(store: PipelineStore) -> None:
    await accept(store, "one", "two", "three")
    claim = await store.take(KEY, "me")
    assert claim is not None
    if claim.rows is not None:
        assert claim.rows == await store.next_rows(KEY, len(claim.rows))
        assert claim.rows and claim.rows[0].event.text == "one"


async def test_a_release_says_whether_rows_are_left(store: PipelineStore) -> None:
    await accept(store, "one")
    lease = await lease_of(store)
    assert await store.release(lease)  # "one" is still unfinished
    lease = await lease_of(store)
    await turn(store, lease)
    assert not await store.release(lease)
    assert (await state(store))["leases"] == [(KEY, None, lease.fence)]


async def test_claimable_keys_are_those_with_rows_and_no_live_lease(store: PipelineStore) -> None:
    await accept(store, "a", chat="a")
    await accept(store, "b", chat="b")
    await lease_of(store, key="webhook:a")
    assert await store.claimable_keys(10) == ["webhook:b"]


async def test_a_claim_asked_for_with_the_event_is_a_real_lease(store: PipelineStore) -> None:
    """Any store may take the key's free lease with its event; if it does, it is the key's
    current lease, and the rows that came with it are the key's next rows."""
    await accept(store, "earlier")
    accepted = await store.accept([event("now")], claim_for="me")
    claim = accepted.claim
    if claim is None:
        return  # this store does not take leases with events: the scheduler takes it
    assert claim.lease.key == KEY and claim.lease.owner == "me"
    assert await store.renew(claim.lease)
    assert await store.take(KEY, "other") is None
    if claim.rows is not None:
        assert claim.rows == await store.next_rows(KEY, len(claim.rows))


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
async def test_with_a_held_lease_or_a_duplicate_the_accept_takes_nothing(store: PipelineStore) -> None:
    held = await store.accept([event("one", external_id="x")], claim_for="me")
    assert held.claim is not None
    again = await store.accept([event("two")], claim_for="other")
    assert again.claim is None  # held by "me"
    assert await store.release(held.claim.lease)
    copy = await store.accept([event("one", external_id="x")], claim_for="other")
    assert copy.results[0].duplicate and copy.claim is None
    taken = await store.take(KEY, "other")
    assert taken is not None and taken.lease.fence == held.claim.lease.fence + 1


async def test_a_claim_is_fenced_like_any_lease(store: PipelineStore) -> None:
    await accept(store, "one")
    old = await lease_of(store, "a")
    assert await store.release(old)
    await lease_of(store, "b")
    gone = SessionLease(KEY, "a", old.fence)
    assert not await store.renew(gone)
