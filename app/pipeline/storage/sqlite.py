"""The SQLite pipeline store: an event's common way in one hop per transaction.

`PortableStore` on aiosqlite was ~40 statements per event, each a SQLAlchemy execution
and two to four hops between the event loop and the driver's thread (`bench/RESULTS.md`).
Here the common cases — accepting events (taking the key's free lease with them), taking
a lease with the key's next rows, counting an attempt, a turn's start (with the history
window and the memory recall the run reads first), each message appended while it runs,
and its end (with the key's next rows, the lease given up, the next waiting key's lease
taken) — are each one transaction run whole in a thread of the store's own
(`app.db.lite`), on its own connection to the same file (`sqlite_turn`).

Where a common case does not apply (a retry, a repair of the history, another channel's
session) and for everything else, the portable code runs, as on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import partial
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel import AcceptResult
from app.db.lite import LiteLink, transaction
from app.db.models import utcnow
from app.events import InboundEvent
from app.memory.store import memory_from_row
from app.pipeline.storage import sqlite_turn as lite
from app.pipeline.storage.port import (
    Accepted,
    Appended,
    Claim,
    Finished,
    InboxRow,
    Started,
    TurnEnd,
    TurnPlan,
)
from app.pipeline.storage.portable import PortableStore, inbox_values
from app.sessions.lease import SessionLease, mine
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore, message_from_row, message_values


def database_file(engine: AsyncEngine) -> str | None:
    """The file of a SQLite engine's database; None for one in memory (or not a file)."""
    url = engine.url
    name = url.database
    if engine.dialect.name != "sqlite" or not name or name == ":memory:" or url.query.get("mode") == "memory":
        return None
    if name.startswith("file:"):
        return None  # a URI: its options would need the same treatment as the engine's
    return name


class SqliteStore(PortableStore):
    """`PipelineStore` on SQLite (see the module)."""

    def __init__(self, engine: AsyncEngine, sessions: SessionStore, *, lease_ttl: float, path: str) -> None:
        super().__init__(engine, sessions, lease_ttl=lease_ttl)
        self.link = LiteLink(path)

    async def close(self) -> None:
        await self.link.close()

    # --- ingest ---------------------------------------------------------------------

    async def accept(self, events: Sequence[InboundEvent], *, claim_for: str | None = None) -> Accepted:
        now = utcnow()
        values = [inbox_values(e, now) for e in events]
        taking = None
        if claim_for is not None and len(events) == 1:
            taking = {"k": events[0].session_key, "o": claim_for, "exp": self._expires(now)}
        originals, fence, rows = await self.link.run(
            transaction(partial(lite.accept, values=values, take=taking))
        )
        results = [
            AcceptResult(event_id=e.event_id, session_key=e.session_key)
            if original is None
            else AcceptResult(
                event_id=original["event_id"], session_key=original["session_key"], duplicate=True
            )
            for e, original in zip(events, originals, strict=True)
        ]
        if fence is None or rows is None:
            return Accepted(results)
        event = events[0]
        lease = SessionLease(event.session_key, claim_for or "", fence)
        this = next((r for r in rows if r["event_id"] == event.event_id), None)
        upcoming = [
            InboxRow(
                r["id"],
                event.event_id,
                event.channel,
                event.session_key,
                0,
                event,
                trace_context=r["trace_context"],
            )
            if r is this
            else InboxRow.of(r)
            for r in rows
        ]
        return Accepted(results, Claim(lease, upcoming))

    # --- leases -------------------------------------------------------------------

    async def take(self, key: str, owner: str) -> Claim | None:
        now = utcnow()
        params = {"k": key, "o": owner, "exp": self._expires(now), "now": now}
        fence, took_over, rows = await self.link.run(transaction(partial(lite.take, params=params)))
        if fence is None:
            return None
        lease = SessionLease(key, owner, fence, took_over=took_over)
        return Claim(lease, None if rows is None else [InboxRow.of(r) for r in rows])

    async def release(self, lease: SessionLease) -> bool:
        return await self.link.run(transaction(partial(lite.release, params=mine(lease))))

    async def next_rows(self, key: str, limit: int) -> list[InboxRow]:
        rows = await self.link.run(partial(lite.next_rows, key=key, limit=limit))
        return [InboxRow.of(r) for r in rows]

    # --- a turn ---------------------------------------------------------------------

    async def count_attempt(self, lease: SessionLease, row_ids: Sequence[int]) -> list[int]:
        params = {**mine(lease), "ids": list(row_ids), "now": utcnow()}
        return await self.link.run(transaction(partial(lite.count_attempt, params=params)))

    async def begin(self, lease: SessionLease, plan: TurnPlan) -> Started:
        """The common start in one transaction: one new event that is answered (else portable)."""
        if len(plan.rows) != 1 or plan.rows[0].attempts or plan.run is None:
            return await super().begin(lease, plan)
        user = plan.user_messages[0]
        params = {
            **mine(lease),
            "chan": plan.channel,
            "cutoff": plan.now - timedelta(seconds=plan.expire_after),
            "now": plan.now,
            "wlimit": plan.window_limit,
            "tally": plan.count_attempt,
            "inbox_id": plan.rows[0].id,
        }
        recall = None if plan.recall is None else (plan.recall.with_user, plan.recall.params)
        start = partial(lite.start, p=params, message=message_values(user, None), run=plan.run, recall=recall)
        try:
            row = await self.link.run(transaction(start))
        except lite.GeneralPath:
            return await super().begin(lease, plan)
        session = SessionState.from_row({**row["session"], "tail_open": False})
        self.sessions.remember(lease.key, session, fence=lease.fence)
        return Started(
            session=session,
            run_id=row["run_id"],
            added=[user],
            seqs=[row["seq"]],
            window=[message_from_row(m) for m in reversed(row["window"])],
            recalled=None if row["recalled"] is None else [memory_from_row(m) for m in row["recalled"]],
        )

    async def append(
        self,
        lease: SessionLease,
        session_id: int,
        new: Sequence[ChatMessage],
        *,
        run_id: int | None,
        handled: Sequence[int] | None = None,
    ) -> Appended:
        if not new:
            return await super().append(lease, session_id, new, run_id=run_id, handled=handled)
        params = {**mine(lease), "sid": session_id, "now": utcnow()}
        rows = [message_values(m, run_id) for m in new]
        seqs, pending = await self.link.run(
            transaction(partial(lite.append, p=params, rows=rows, handled=handled))
        )
        return Appended(seqs, pending=None if pending is None else [InboxRow.of(r) for r in pending])

    async def finish(self, lease: SessionLease, end: TurnEnd) -> Finished:
        params: dict[str, Any] = {
            **mine(lease),
            "release": end.release,
            "sid": end.session_id,
            "now": end.now,
            "ids": list(end.inbox_ids),
            "link": end.link,
            "run": end.run_id,
            "nk": end.successor,
            "exp": self._expires(end.now),
        }
        finish = partial(
            lite.finish,
            p=params,
            answer=message_values(end.answer, end.run_id),
            reply=dict(end.reply),
            trace=dict(end.trace),
        )
        row = await self.link.run(transaction(finish))
        successor = None
        if row["successor"] is not None and end.successor is not None:
            fence, rows = row["successor"]
            successor = Claim(SessionLease(end.successor, lease.owner, fence), [InboxRow.of(r) for r in rows])
        return Finished(
            row["seq"],
            released=row["released"],
            upcoming=[InboxRow.of(r) for r in row["upcoming"]],
            successor=successor,
        )
