"""A turn's start counts its attempt in its own commit (`TurnPlan.count_attempt`), on every
store: one commit less per turn, and still no event is tried for ever."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from app.db.models import CANCELED, inbox
from app.errors import RowsCanceled
from app.pipeline.storage.port import PipelineStore
from app.sessions.messages import ChatMessage
from tests.pipeline.conftest import engine_of
from tests.pipeline.support import KEY, accept, end, lease_of, plan, state


async def test_a_start_that_counts_marks_its_rows_processing_with_one_attempt(store: PipelineStore) -> None:
    await accept(store, "hello")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    started = await store.start(lease, plan([row], count_attempt=True))
    assert (await state(store))["inbox"] == [("processing", 1, None)]
    await store.finish(lease, end(started, [row]))
    assert (await state(store))["inbox"] == [("done", 1, None)]


async def test_a_start_that_counts_a_canceled_row_writes_nothing(store: PipelineStore) -> None:
    await accept(store, "first", "second")
    lease = await lease_of(store)
    first, second = await store.next_rows(KEY, 2)
    async with engine_of(store).begin() as conn:
        await conn.execute(update(inbox).where(inbox.c.id == second.id).values(status=CANCELED))
    before = await state(store)
    with pytest.raises(RowsCanceled) as canceled:
        await store.start(lease, plan([first, second], count_attempt=True))
    assert canceled.value.ids == {second.id}
    assert await state(store) == before
    with pytest.raises(RowsCanceled):
        await store.start(lease, plan([second], count_attempt=True))
    assert await state(store) == before


async def test_a_start_the_database_refuses_still_counts_its_attempt(store: PipelineStore) -> None:
    """The start's commit fails with it; the attempt is then counted in a commit of its own."""
    await accept(store, "hello")
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    refused = plan([row], count_attempt=True)
    # A message no store can append: no role (the column is NOT NULL).
    bad = ChatMessage(role="user", content="hello")
    object.__setattr__(bad, "role", None)
    object.__setattr__(refused, "user_messages", [bad])
    with pytest.raises(Exception):  # noqa: B017 - whatever the driver raises
        await store.start(lease, refused)
    [again] = await store.next_rows(KEY, 1)
    assert again.attempts == 1
