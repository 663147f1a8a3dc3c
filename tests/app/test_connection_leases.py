"""One holder per long-lived connection, on both backends: exclusive, released, taken over."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.connection_leases import DatabaseConnections, list_holds
from app.db.models import connection_leases, utcnow


class Connection:
    """A stand-in platform connection: records who ran it and whether it was cancelled."""

    def __init__(self) -> None:
        self.running: set[str] = set()
        self.cancelled: list[str] = []
        self.changed = asyncio.Event()

    def run_as(self, owner: str):  # type: ignore[no-untyped-def]
        async def run() -> None:
            self.running.add(owner)
            self.changed.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled.append(owner)
                raise
            finally:
                self.running.discard(owner)
                self.changed.set()

        return run

    async def wait(self, predicate, timeout: float = 10) -> None:  # type: ignore[no-untyped-def]
        async def until() -> None:
            while not predicate():
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(until(), timeout)


@contextlib.asynccontextmanager
async def holding(
    holder: DatabaseConnections, name: str, conn: Connection
) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(holder.hold_connection(name, conn.run_as(holder.owner)))
    try:
        yield task
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_one_holder_at_a_time_and_a_stopped_holder_frees_it_at_once(engine: AsyncEngine) -> None:
    conn = Connection()
    first = DatabaseConnections(engine, "replica-a", ttl=30, retry_seconds=0.05)
    second = DatabaseConnections(engine, "replica-b", ttl=30, retry_seconds=0.05)
    async with holding(first, "test:bot", conn) as first_task:
        await conn.wait(lambda: conn.running == {"replica-a"})
        async with holding(second, "test:bot", conn):
            await asyncio.sleep(0.3)  # the second keeps asking, and does not get it
            assert conn.running == {"replica-a"}
            [hold] = await list_holds(engine)
            assert (hold.owner, hold.fence, hold.takeovers) == ("replica-a", 1, 0)
            first_task.cancel()  # shutdown: the lease is released, no need to wait for the TTL
            await conn.wait(lambda: conn.running == {"replica-b"}, timeout=5)
            assert conn.cancelled == ["replica-a"]
            [hold] = await list_holds(engine)
            assert (hold.owner, hold.fence, hold.takeovers) == ("replica-b", 2, 0)


async def test_a_stalled_holder_is_taken_over_and_its_connection_cancelled(engine: AsyncEngine) -> None:
    conn = Connection()
    taken: list[str] = []
    first = DatabaseConnections(engine, "replica-a", ttl=1.5, retry_seconds=0.05)
    second = DatabaseConnections(engine, "replica-b", ttl=1.5, retry_seconds=0.05, on_takeover=taken.append)
    async with holding(first, "test:bot", conn):
        await conn.wait(lambda: conn.running == {"replica-a"})
        async with holding(second, "test:bot", conn):
            # replica-a stalls: its lease is not renewed in time (as after a long pause).
            async with engine.begin() as db:
                await db.execute(update(connection_leases).values(expires_at=utcnow() - timedelta(seconds=1)))
            await conn.wait(lambda: "replica-b" in conn.running, timeout=5)
            # replica-a's next renewal finds the fence moved on and cancels its connection.
            await conn.wait(lambda: conn.running == {"replica-b"}, timeout=5)
            assert conn.cancelled == ["replica-a"]
            await asyncio.sleep(1.0)  # and does not take it back while replica-b renews
            assert conn.running == {"replica-b"}
            [hold] = await list_holds(engine)
            assert (hold.owner, hold.takeovers) == ("replica-b", 1)
            assert taken == ["test:bot"]
            assert first.held == {} and set(second.held) == {"test:bot"}


async def test_a_connection_that_ends_is_given_up_and_sought_again(engine: AsyncEngine) -> None:
    runs: list[int] = []

    async def short() -> None:
        runs.append(1)
        raise RuntimeError("platform closed the socket")

    holder = DatabaseConnections(engine, "replica-a", ttl=5, retry_seconds=0.05)
    task = asyncio.create_task(holder.hold_connection("test:short", short))
    try:
        async with asyncio.timeout(5):
            while len(runs) < 3:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    [hold] = await list_holds(engine)
    assert hold.owner is None  # released after each end, and at the shutdown
    assert hold.fence >= 3


async def test_state_is_saved_by_the_holder_only_and_read_by_the_next(engine: AsyncEngine) -> None:
    conn = Connection()
    first = DatabaseConnections(engine, "replica-a", ttl=30, retry_seconds=0.05)
    second = DatabaseConnections(engine, "replica-b", ttl=30, retry_seconds=0.05)
    assert await first.load_state("test:bot") is None
    async with holding(first, "test:bot", conn) as first_task:
        await conn.wait(lambda: conn.running == {"replica-a"})
        assert await first.save_state("test:bot", {"session_id": "s-1", "seq": 7})
        assert not await second.save_state("test:bot", {"session_id": "forged"})  # not its lease
        async with holding(second, "test:bot", conn):
            first_task.cancel()
            await conn.wait(lambda: conn.running == {"replica-b"}, timeout=5)
            assert await second.load_state("test:bot") == {"session_id": "s-1", "seq": 7}
            assert not await first.save_state("test:bot", {"seq": 1})  # a former holder writes nothing
            assert await second.save_state("test:bot", {"session_id": "s-1", "seq": 9})
    assert await first.load_state("test:bot") == {"session_id": "s-1", "seq": 9}
    [hold] = await list_holds(engine)
    assert not hasattr(hold, "state")  # kept for the holder, not shown
