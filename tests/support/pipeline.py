"""The pipeline as another replica would use it: its store and waiters on the same database."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel import AcceptResult, WaitResult
from app.events import InboundEvent
from app.pipeline.storage import build_store
from app.pipeline.storage.port import PipelineStore
from app.pipeline.waiters import Waiters
from app.sessions.store import Lifecycle, SessionStore


def store_for(engine: AsyncEngine, kind: str = "auto") -> PipelineStore:
    return build_store(engine, SessionStore(engine, Lifecycle()), lease_ttl=30.0, kind=kind)


async def accept_elsewhere(engine: AsyncEngine, events: Sequence[InboundEvent]) -> list[AcceptResult]:
    """Store events as another replica's ingest would: nothing here is woken for them."""
    return (await store_for(engine).accept(events)).results


async def wait_elsewhere(engine: AsyncEngine, event_id: str, timeout: float) -> WaitResult:
    """Wait for an event's replies as another replica's waiter would (reading the database)."""
    return await Waiters(store_for(engine)).wait_for_replies(event_id, timeout)
