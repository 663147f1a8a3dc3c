"""The portable pipeline store: SQLAlchemy transactions, on SQLite and on PostgreSQL.

Every method is a short transaction of plain statements; every write for a key runs
`check_fence` first in the same transaction (`fenced`). This is the whole contract of
`PipelineStore`; `PostgresStore` does the common cases in fewer round trips and comes
back here for the rest.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app import tracing
from app.channel import AcceptResult, WaitResult
from app.db.engine import autocommit
from app.db.models import INBOX_UNFINISHED, inbox, one_of, outbox, runs, utcnow
from app.db.upsert import insert_ignore
from app.errors import LeaseLost, RowsCanceled
from app.events import InboundEvent, stored_json
from app.pipeline.run_trace import UPDATE_RUN
from app.pipeline.storage import inbox_queries as q
from app.pipeline.storage.history import close_open_group
from app.pipeline.storage.inbox_queries import reply_of
from app.pipeline.storage.operations import Operations
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
from app.pipeline.storage.reclaim import free_expired_leases
from app.sessions import lease as leases
from app.sessions.lease import SessionLease, check_fence
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionStore

log = structlog.get_logger(__name__)

_INSERT_RUN = runs.insert().returning(runs.c.id)
_INSERT_OUTBOX = outbox.insert()
_UNFINISHED_LEFT = (
    select(inbox.c.id)
    .where(inbox.c.session_key == bindparam("k"), one_of(inbox.c.status, INBOX_UNFINISHED))
    .limit(1)
)


def inbox_values(event: InboundEvent, now: Any) -> dict[str, Any]:
    """An accepted event's inbox row."""
    return dict(
        event_id=event.event_id,
        channel=event.channel,
        external_id=event.external_id,
        session_key=event.session_key,
        payload=stored_json(event),
        status="pending",
        attempts=0,
        created_at=now,
        updated_at=now,
        trace_context=tracing.carrier(),
    )


def storable_error(error: str, limit: int = 2000) -> str:
    """An error text any database can store: no NUL, no lone surrogates, bounded."""
    clean = error.replace("\x00", "\\0").encode("utf-8", "backslashreplace").decode("utf-8")
    return clean[:limit]


class PortableStore(Operations):
    """`PipelineStore` in SQLAlchemy transactions (see the module); the operations of
    commands, steering and the outbox are `Operations`'."""

    def __init__(self, engine: AsyncEngine, sessions: SessionStore, *, lease_ttl: float) -> None:
        self.engine = engine
        self.reader = autocommit(engine)  # one statement, no BEGIN/COMMIT
        self._sessions = sessions
        self.lease_ttl = lease_ttl
        # Chosen once: replicas claiming outbox rows at once pass over each other's.
        self.skip_locked = engine.dialect.name == "postgresql"

    @property
    def sessions(self) -> SessionStore:
        return self._sessions

    def _expires(self, now: datetime) -> datetime:
        """When a lease taken at `now` runs out."""
        return now + timedelta(seconds=self.lease_ttl)

    async def close(self) -> None:
        """Nothing of its own: its connections are the engine's."""

    # --- ingest ---------------------------------------------------------------------

    async def accept(self, events: Sequence[InboundEvent], *, claim_for: str | None = None) -> Accepted:
        now = utcnow()
        results: list[AcceptResult] = []
        async with self.engine.begin() as conn:
            for event in events:
                results.append(await self._store(conn, event, now))
        return Accepted(results)

    async def _store(self, conn: AsyncConnection, event: InboundEvent, now: Any) -> AcceptResult:
        values = inbox_values(event, now)
        if event.external_id is None:
            await conn.execute(inbox.insert(), values)
            return AcceptResult(event_id=event.event_id, session_key=event.session_key)
        stored = await conn.execute(
            insert_ignore(conn, inbox, ["channel", "external_id"]).returning(inbox.c.id), values
        )
        if stored.first() is not None:
            return AcceptResult(event_id=event.event_id, session_key=event.session_key)
        return await self.original(conn, event)

    @staticmethod
    async def original(conn: Any, event: InboundEvent) -> AcceptResult:
        """The stored event that `event` duplicates."""
        found = (await conn.execute(q.ORIGINAL, {"ch": event.channel, "ext": event.external_id})).one()
        return AcceptResult(event_id=found.event_id, session_key=found.session_key, duplicate=True)

    async def replies_if_done(self, event_id: str) -> WaitResult | None:
        async with self.reader.connect() as conn:
            rows = (await conn.execute(q.STATUS_AND_REPLIES, {"e": event_id})).mappings().all()
        if not rows or rows[0]["event_status"] in INBOX_UNFINISHED:
            return None
        replies = [reply_of(r["message_id"], r["payload"], r["status"]) for r in rows if r["id"] is not None]
        return WaitResult(done=True, replies=replies)

    async def claimable_keys(self, limit: int) -> list[str]:
        async with self.reader.connect() as conn:
            rows = await conn.execute(q.CLAIMABLE, {"now": utcnow(), "limit": limit})
            return [r[0] for r in rows]

    async def reclaim_expired(self, limit: int) -> list[str]:
        return await free_expired_leases(self.engine, utcnow(), limit)

    # --- leases -------------------------------------------------------------------

    async def take(self, key: str, owner: str) -> Claim | None:
        lease = await leases.acquire(self.engine, key, owner, self.lease_ttl)
        return None if lease is None else Claim(lease)

    async def renew(self, lease: SessionLease) -> bool:
        return await leases.renew(self.engine, lease, self.lease_ttl)

    async def release(self, lease: SessionLease) -> bool:
        return await leases.release(self.engine, lease)

    async def next_rows(self, key: str, limit: int) -> list[InboxRow]:
        async with self.reader.connect() as conn:
            rows = (await conn.execute(q.NEXT_ROWS, {"k": key, "limit": limit})).mappings().all()
        return [InboxRow.of(r) for r in rows]

    # --- a turn ---------------------------------------------------------------------

    @asynccontextmanager
    async def fenced(self, lease: SessionLease) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            yield conn

    async def count_attempt(self, lease: SessionLease, row_ids: Sequence[int]) -> list[int]:
        async with self.fenced(lease) as conn:
            counted = await conn.execute(
                q.COUNT_UNFINISHED, {"ids": list(row_ids), "status": "processing", "updated_at": utcnow()}
            )
            return [r[0] for r in counted]

    @staticmethod
    async def _count_all(conn: AsyncConnection, ids: list[int]) -> None:
        """Count the attempt of all `ids` in this transaction, or `RowsCanceled` (it rolls back)."""
        counted = await conn.execute(
            q.COUNT_UNFINISHED, {"ids": ids, "status": "processing", "updated_at": utcnow()}
        )
        canceled = frozenset(ids) - {r[0] for r in counted}
        if canceled:
            raise RowsCanceled(canceled)

    async def note_error(self, row_ids: Sequence[int], error: str) -> None:
        async with self.reader.connect() as conn:
            await conn.execute(q.NOTE_ERROR, {"ids": list(row_ids), "note": storable_error(error)})

    async def fail(
        self, lease: SessionLease, rows: Sequence[InboxRow], reason: str, replies: Sequence[Mapping[str, Any]]
    ) -> None:
        failed = {"ids": [r.id for r in rows], "reason": storable_error(reason), "at": utcnow()}
        try:
            async with self.fenced(lease) as conn:
                await conn.execute(q.FAIL, failed)
                if replies:
                    await conn.execute(_INSERT_OUTBOX, [dict(r) for r in replies])
        except (DBAPIError, StatementError) as exc:
            if not replies:
                raise
            # A reply the database cannot store (it carries the bad event's target) must
            # not keep the rows from failing: they fail without telling their sender.
            log.warning("failure_reply_not_stored", error=storable_error(str(exc), 300))
            async with self.fenced(lease) as conn:
                await conn.execute(q.FAIL, failed)

    async def start(self, lease: SessionLease, plan: TurnPlan) -> Started:
        try:
            return await self.begin(lease, plan)
        except (LeaseLost, RowsCanceled):
            raise
        except Exception:
            if plan.count_attempt:
                # The start failed, its count with it: the attempt counts all the same, or a
                # row the database refuses would be tried for ever.
                await self.count_attempt(lease, [r.id for r in plan.rows])
            raise

    async def begin(self, lease: SessionLease, plan: TurnPlan) -> Started:
        """`start` as one transaction: continue or open the key's session, append the user
        messages, insert the run (and count the attempt when the plan says so)."""
        rows = plan.rows
        async with self.fenced(lease) as conn:
            if plan.count_attempt:
                await self._count_all(conn, [r.id for r in rows])
            if any(r.attempts for r in rows):
                # A retry: the run an earlier attempt started died with its worker.
                await conn.execute(
                    update(runs)
                    .where(runs.c.session_key == lease.key, runs.c.outcome == "running")
                    .values(
                        outcome="crashed", error="the worker stopped during the run", finished_at=utcnow()
                    )
                )
            session = await self.sessions.open_current(conn, lease.key, plan.channel, fence=lease.fence)
            # Close a tool-call group a crash or a pending approval left open *before* the
            # new user message, so the history stays one legal trajectory.
            repairs = await close_open_group(
                conn, self.sessions, session, reason="a new message arrived first"
            )
            # Only a retry (its attempt counted before) can have appended its message already.
            new_user = [
                message
                for row, message in zip(rows, plan.user_messages, strict=True)
                if row.attempts == 0 or not await self.sessions.has_event(conn, session.id, row.event_id)
            ]
            added = [*repairs, *new_user]
            seqs = await self.sessions.append(conn, session.id, added)
            run_id: int | None = None
            if plan.run is not None:
                run_id = int(
                    (await conn.execute(_INSERT_RUN, {**plan.run, "session_id": session.id})).scalar_one()
                )
            else:
                await conn.execute(
                    q.MARK, {"ids": [r.id for r in rows], "status": "done", "updated_at": utcnow()}
                )
        return Started(session=session, run_id=run_id, added=added, seqs=seqs)

    async def append(
        self,
        lease: SessionLease,
        session_id: int,
        new: Sequence[ChatMessage],
        *,
        run_id: int | None,
        handled: Sequence[int] | None = None,
    ) -> Appended:
        async with self.fenced(lease) as conn:
            seqs = await self.sessions.append(conn, session_id, new, run_id=run_id)
        return Appended(seqs)

    async def finish(self, lease: SessionLease, end: TurnEnd) -> Finished:
        released = False
        async with self.fenced(lease) as conn:
            [seq] = await self.sessions.append(
                conn, end.session_id, [end.answer], run_id=end.run_id, now=end.now
            )
            await conn.execute(_INSERT_OUTBOX, dict(end.reply))
            done: dict[str, Any] = {"ids": list(end.inbox_ids), "status": "done", "updated_at": end.now}
            if end.link is not None:
                done["run_id"] = end.link
            await conn.execute(q.MARK, done)
            await conn.execute(UPDATE_RUN, {**end.trace, "run_id_": end.run_id})
            if end.release and (await conn.execute(_UNFINISHED_LEFT, {"k": lease.key})).first() is None:
                await conn.execute(leases.LET_GO, leases.mine(lease))
                released = True
        return Finished(seq, released=released)

    async def run_row(self, run_id: int) -> tuple[list[str], dict[str, Any], Any]:
        """A run's event ids, details and start, as stored."""
        async with self.reader.connect() as conn:
            stored = (
                await conn.execute(
                    select(runs.c.event_ids, runs.c.details, runs.c.started_at).where(runs.c.id == run_id)
                )
            ).one()
        return list(stored.event_ids or []), dict(stored.details or {}), stored.started_at
