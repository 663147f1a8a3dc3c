"""The PostgreSQL pipeline store: the common cases in one round trip each.

`PortableStore` does every method as a transaction of plain statements. On PostgreSQL
most of an event's cost was those round trips (`bench/RESULTS.md`), so here:

- single events arriving together are stored by one statement (`pg_group_insert`), and
  an event whose accepting replica has a run slot for its key takes the key's free lease
  in the statement that stores it (`pg_inbox.ACCEPT_TAKING`);
- taking a lease reads the key's next rows, and so does a turn's end (`pg_inbox.TAKE`,
  `pg_turn.FINISH`), so a worker rarely reads them on its own;
- a turn's start, each message appended during its run, its end (which may also give
  the lease up, and take the next waiting key's) are one statement each (`pg_start`,
  `pg_turn`); the starts of several keys' turns arriving together share one
  (`pg_start_group`), and so do their ends (`pg_finish_group`);
- the hottest statements run on asyncpg directly (`app.db.direct`).

Where a common case does not apply (a batch of events, a retry, a repair of the history,
another channel's session), the portable code runs. Both are tested against each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel import AcceptResult
from app.db import direct
from app.db.models import utcnow
from app.errors import LeaseLost, RowsCanceled
from app.events import InboundEvent
from app.memory.store import Memory, memory_from_row
from app.pipeline.storage import pg_inbox, pg_turn
from app.pipeline.storage.pg_finish_group import FinishGroup
from app.pipeline.storage.pg_group_insert import GroupInsert
from app.pipeline.storage.pg_inbox import rows_from
from app.pipeline.storage.pg_start_group import StartGroup
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
from app.sessions import lease as leases
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore, message_from_row, message_values


class PostgresStore(PortableStore):
    """`PipelineStore` on PostgreSQL (see the module)."""

    def __init__(self, engine: AsyncEngine, sessions: SessionStore, *, lease_ttl: float) -> None:
        super().__init__(engine, sessions, lease_ttl=lease_ttl)
        self._group = GroupInsert(self.reader, insert_one=self._insert_alone)
        self._starts = StartGroup(self.reader)
        self._ends = FinishGroup(self.reader)

    # --- ingest ---------------------------------------------------------------------

    async def accept(self, events: Sequence[InboundEvent], *, claim_for: str | None = None) -> Accepted:
        if len(events) != 1:
            return await super().accept(events)  # one platform request's batch: a transaction
        event, now = events[0], utcnow()
        if claim_for is not None:
            return await self._accept_taking(event, now, claim_for)
        # With the other single events arriving now.
        if await self._group.insert(event, now):
            return Accepted([AcceptResult(event_id=event.event_id, session_key=event.session_key)])
        async with direct.connect(self.reader) as conn:
            return Accepted([await self._original(conn, event)])

    async def _insert_alone(self, event: InboundEvent, now: datetime) -> bool:
        """One event in a statement of its own (the group's retry): whether it was stored."""
        values = inbox_values(event, now)
        async with direct.connect(self.reader) as conn:
            if event.external_id is None:
                await pg_inbox.INSERT.rows(conn, values)
                return True
            return await pg_inbox.INSERT_NEW.first(conn, values) is not None

    @staticmethod
    async def _original(conn: direct.DirectConnection, event: InboundEvent) -> AcceptResult:
        found = await pg_inbox.FIND_ORIGINAL.one(conn, {"ch": event.channel, "ext": event.external_id})
        return AcceptResult(event_id=found["event_id"], session_key=found["session_key"], duplicate=True)

    async def _accept_taking(self, event: InboundEvent, now: datetime, owner: str) -> Accepted:
        key = event.session_key
        params = {**inbox_values(event, now), "k": key, "o": owner, "exp": self._expires(now)}
        async with direct.connect(self.reader) as conn:
            row = await pg_inbox.ACCEPT_TAKING[event.external_id is not None].one(conn, params)
            if row["id"] is None:  # a duplicate: no lease was taken for it
                return Accepted([await self._original(conn, event)])
        accepted = AcceptResult(event_id=event.event_id, session_key=key)
        if row["fence"] is None:
            return Accepted([accepted])
        rows = rows_from(row["upcoming"])
        if rows is not None:
            this = InboxRow(
                row["id"], event.event_id, event.channel, key, 0, event, trace_context=params["trace_context"]
            )
            rows = [*rows, this][: pg_inbox.LIMIT]
        return Accepted([accepted], Claim(SessionLease(key, owner, row["fence"]), rows))

    # --- leases -------------------------------------------------------------------

    async def take(self, key: str, owner: str) -> Claim | None:
        lease, taken = await leases.acquire_reading(
            self.engine, key, owner, self.lease_ttl, take=pg_inbox.TAKE
        )
        if lease is None:
            return None
        return Claim(lease, None if taken is None else rows_from(taken["upcoming"]))

    async def next_rows(self, key: str, limit: int) -> list[InboxRow]:
        async with direct.connect(self.reader) as conn:
            rows = await pg_inbox.NEXT.rows(conn, {"k": key, "limit": limit})
        return [InboxRow.of(r) for r in rows]

    # --- a turn ---------------------------------------------------------------------

    async def _fenced_statement(
        self, statement: direct.Direct, lease: SessionLease, params: dict[str, Any]
    ) -> Any:
        """Run `statement` under the lease; `LeaseLost` when its fence had no row (nothing written)."""
        params.update(k=lease.key, o=lease.owner, f=lease.fence)
        async with direct.connect(self.reader) as conn:
            row = await statement.one(conn, params)
        if row["held"] != 1:
            raise LeaseLost(lease.key, lease.fence)
        return row

    async def count_attempt(self, lease: SessionLease, row_ids: Sequence[int]) -> list[int]:
        row = await self._fenced_statement(pg_turn.COUNT_ATTEMPT, lease, {"inbox_ids": list(row_ids)})
        return list(row["ids"] or [])

    async def begin(self, lease: SessionLease, plan: TurnPlan) -> Started:
        """The common start in one statement: one new event that is answered (else portable)."""
        if len(plan.rows) != 1 or plan.rows[0].attempts or plan.run is None:
            return await super().begin(lease, plan)
        user = plan.user_messages[0]
        params: dict[str, Any] = {
            "chan": plan.channel,
            "cutoff": plan.now - timedelta(seconds=plan.expire_after),
            "now": plan.now,
            "meta": {},
            "wlimit": plan.window_limit,
        }
        params.update({"m_" + name: value for name, value in message_values(user, None).items()})
        params.update({"r_" + name: plan.run[name] for name in pg_turn.RUN_FIELDS[1:]})
        recall = plan.recall
        if recall is not None:
            params.update(recall.params)
        params.update(tally=plan.count_attempt, inbox_id=plan.rows[0].id)
        # With the starts of other keys' turns that arrive meanwhile (`pg_start_group`).
        params.update(k=lease.key, o=lease.owner, f=lease.fence)
        row = await self._starts.start(params, recall=None if recall is None else recall.with_user)
        if row["held"] != 1:
            raise LeaseLost(lease.key, lease.fence)
        if plan.count_attempt and not row["countable"]:
            raise RowsCanceled(frozenset([plan.rows[0].id]))
        if row["id"] is None:
            return await super().begin(lease, plan)  # neither common case: the general path
        session = SessionState.from_row({**row, "tail_open": False})
        self.sessions.remember(lease.key, session, fence=lease.fence)
        added = message_from_row({**message_values(user, None), "seq": row["seq"]})
        return Started(
            session=session,
            run_id=row["run_id"],
            added=[user],
            seqs=[row["seq"]],
            window=[*(message_from_row(m) for m in row["window"]), added],
            recalled=None if recall is None else [_memory(m) for m in row["recalled"]],
            watched=bool(row["watched"]),
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
        if len(new) != 1:
            return await super().append(lease, session_id, new, run_id=run_id, handled=handled)
        message = new[0]
        # The model's tool calls are redone if a database crash loses them (the run is
        # retried); tool results record what a tool did and wait for the disk, which also
        # flushes the calls before them.
        lax = message.role == "assistant" and bool(message.tool_calls)
        params: dict[str, Any] = {"sid": session_id, "now": utcnow()}
        params.update({"m_" + name: value for name, value in message_values(message, run_id).items()})
        if handled is not None:
            params["handled"] = list(handled)
        row = await self._fenced_statement(pg_turn.APPEND[lax, handled is not None], lease, params)
        pending = rows_from(row["pending"]) if handled is not None else None
        return Appended([_seq(row, session_id, lease)], bool(row["watched"]), pending)

    async def finish(self, lease: SessionLease, end: TurnEnd) -> Finished:
        params: dict[str, Any] = {
            "release": end.release,
            "sid": end.session_id,
            "now": end.now,
            "inbox_ids": list(end.inbox_ids),
            "link": end.link,
            "run": end.run_id,
        }
        params.update({"m_" + name: value for name, value in message_values(end.answer, end.run_id).items()})
        params.update({"o_" + name: end.reply[name] for name in pg_turn.OUTBOX_FIELDS})
        params.update({"r_" + name: end.trace.get(name) for name in pg_turn.RUN_TRACE})
        if end.successor is not None:
            params.update(nk=end.successor, exp=self._expires(end.now))
        # With the ends of other keys' turns that arrive meanwhile (`pg_finish_group`).
        params.update(k=lease.key, o=lease.owner, f=lease.fence)
        row = await self._ends.finish(params, hand_on=end.successor is not None)
        if row["held"] != 1:
            raise LeaseLost(lease.key, lease.fence)
        successor = None
        if end.successor is not None and row["successor_fence"] is not None:
            taken = SessionLease(end.successor, lease.owner, row["successor_fence"])
            successor = Claim(taken, rows_from(row["successor_upcoming"]))
        return Finished(
            _seq(row, end.session_id, lease),
            bool(row["watched"]),
            released=bool(row["released"]),
            upcoming=rows_from(row["upcoming"]),
            successor=successor,
        )


def _seq(row: Any, session_id: int, lease: SessionLease) -> int:
    if row["seq"] is None:
        raise RuntimeError(f"session {session_id} of {lease.key!r} is gone")
    return int(row["seq"])


def _memory(row: dict[str, Any]) -> Memory:
    """A recalled entry from its JSON object (times are ISO strings there)."""
    return memory_from_row({**row, "updated_at": datetime.fromisoformat(row["updated_at"])})
