"""The inbox: accepted events, committed before the platform is answered."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import bindparam, func, or_, select, union_all, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.channel import AcceptResult, Reply, WaitResult
from app.db import direct
from app.db.direct import Direct, DirectConnection
from app.db.engine import autocommit
from app.db.models import INBOX_UNFINISHED, inbox, one_of, outbox, session_keys, utcnow
from app.db.upsert import insert_ignore_for
from app.events import InboundEvent
from app.pipeline.group_insert import GroupInsert
from app.sessions.lease import SessionLease

if TYPE_CHECKING:
    from app.pipeline.fused import Started, StartPlan

ACTIVE_STATUSES = INBOX_UNFINISHED


# What an `InboxRow` is made of.
_ROW_COLUMNS = ("id", "event_id", "channel", "session_key", "attempts", "payload")


def unfinished_rows(key: Any = None) -> Any:
    """The `key` key's unfinished rows in inbox order (the order they are handled in).

    `key` is an expression, by default the bound parameter `k`.
    """
    return (
        select(*(inbox.c[name] for name in _ROW_COLUMNS))
        .where(
            inbox.c.session_key == (bindparam("k") if key is None else key),
            one_of(inbox.c.status, ACTIVE_STATUSES),
        )
        .order_by(inbox.c.id)
    )


_NEXT_ROWS = Direct(unfinished_rows().limit(bindparam("limit")))  # built once: used before turns
# The other columns to set come with the parameters.
_MARK = update(inbox).where(inbox.c.id.in_(bindparam("ids", expanding=True)))
_MARK_BUMP = _MARK.values(attempts=inbox.c.attempts + 1)
# Ingest, built once per backend: the values come with the parameters.
_INGESTED = (
    "event_id",
    "channel",
    "external_id",
    "session_key",
    "payload",
    "status",
    "attempts",
    "created_at",
    "updated_at",
)
INSERT_VALUES = {name: bindparam(name, type_=inbox.c[name].type) for name in _INGESTED}
_INSERT = Direct(inbox.insert().values(INSERT_VALUES))
_INSERT_NEW = {
    name: Direct(
        insert_ignore_for(name, inbox, ["channel", "external_id"]).values(INSERT_VALUES).returning(inbox.c.id)
    )
    for name in ("postgresql", "sqlite")
}
_ORIGINAL = Direct(
    select(inbox.c.event_id, inbox.c.session_key).where(
        inbox.c.channel == bindparam("ch"), inbox.c.external_id == bindparam("ext")
    )
)


def _status_and_replies() -> Any:
    """What a waiter reads: the event's status and its replies, in one statement.

    The replies are the outbox rows of the event's run, or of the event itself when no
    run is linked; the outer joins give one row with no reply when there is none yet.
    """
    columns = (
        inbox.c.status.label("event_status"),
        outbox.c.id,
        outbox.c.message_id,
        outbox.c.payload,
        outbox.c.status,
    )
    event = inbox.c.event_id == bindparam("e")
    of_run = (
        select(*columns)
        .select_from(inbox.outerjoin(outbox, outbox.c.run_id == inbox.c.run_id))
        .where(event, inbox.c.run_id.is_not(None))
    )
    of_event = (
        select(*columns)
        .select_from(inbox.outerjoin(outbox, outbox.c.event_id == inbox.c.event_id))
        .where(event, inbox.c.run_id.is_(None))
    )
    both = union_all(of_run, of_event).subquery()
    return select(both).order_by(both.c.id)


_STATUS_AND_REPLIES = _status_and_replies()
_CLAIMABLE = (
    select(inbox.c.session_key)
    .select_from(inbox.outerjoin(session_keys, session_keys.c.key == inbox.c.session_key))
    .where(
        one_of(inbox.c.status, ACTIVE_STATUSES),
        or_(session_keys.c.lease_owner.is_(None), session_keys.c.lease_expires_at < bindparam("now")),
    )
    .group_by(inbox.c.session_key)
    .order_by(func.min(inbox.c.id))
    .limit(bindparam("limit"))
)


@dataclass(frozen=True)
class InboxRow:
    id: int
    event_id: str
    channel: str
    session_key: str
    attempts: int
    event: InboundEvent
    # Its turn's start, when the statement that accepted it wrote that too (`Claimer.start_plan`).
    started: Started | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> InboxRow:
        """From a row (or JSON object) with the `_ROW_COLUMNS`."""
        return cls(
            id=row["id"],
            event_id=row["event_id"],
            channel=row["channel"],
            session_key=row["session_key"],
            attempts=row["attempts"],
            event=InboundEvent.model_validate(row["payload"]),
        )


class Claimer(Protocol):
    """Who may take a key's lease in the statement that accepts its event (the dispatcher)."""

    owner: str
    lease_ttl: float
    rows_limit: int  # how many of the key's next rows a claim hands over at most

    def accept_statement(self, *, dedup: bool, plan: StartPlan | None) -> Direct:
        """`prefetch.ACCEPT_TAKING`, or with a `plan` `accept_start.ACCEPT_STARTING`."""
        ...

    def start_plan(self, event: InboundEvent, now: datetime) -> StartPlan | None:
        """The start of the turn the event would begin if it is next, when its accept may write it."""
        ...

    def reserve(self, key: str) -> bool:
        """A run slot for `key`, if one is free and no worker of `key` runs here."""
        ...

    def taken(self, key: str, lease: SessionLease, rows: list[InboxRow] | None) -> None:
        """The lease was taken with the event: start the key's turns (uses the slot)."""

    def unreserve(self, key: str) -> None:
        """The lease was not taken: give the slot back."""


# A lease taken with an event, and the key's next rows when they could be read with it.
Claim = tuple[SessionLease, list[InboxRow] | None]


class Inbox:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.reader = autocommit(engine)
        self._waiters: dict[str, asyncio.Event] = {}
        # Events accepted here and not yet handled here: a waiter need not ask the
        # database before the first wake-up (bounded; other replicas' work is polled).
        self._unhandled: OrderedDict[str, None] = OrderedDict()
        self.on_accepted: Callable[[str], None] | None = None
        self.claimer: Claimer | None = None
        # Results handed over by the turn that handled a waited-for event here.
        self._known: dict[str, WaitResult] = {}
        self._group = (
            GroupInsert(
                self.reader,
                insert_one=self._insert_alone,
                stored=lambda event: self._stored(event.event_id, event.session_key),
            )
            if engine.dialect.name == "postgresql"
            else None
        )

    async def accept(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        """Store events (dedup on channel + external id) and commit; then wake the dispatcher.

        With a `claimer` (PostgreSQL), a single event's statement also takes its key's
        lease when the lease is free and the claimer has a run slot for the key: the
        claimer then starts the key's turns with that lease (`prefetch.ACCEPT_TAKING`).
        """
        now = utcnow()
        claimer = self.claimer if len(events) == 1 else None
        if claimer is not None and claimer.reserve(events[0].session_key):
            # Shielded: a caller cancelled mid-statement must not leave the lease taken
            # and nobody working under it (until it expired).
            return [await asyncio.shield(self._accept_claiming(events[0], now, claimer))]
        if len(events) == 1 and self._group is not None:
            # With the other single events arriving now (`GroupInsert` calls `_stored`).
            event = events[0]
            if await self._group.insert(event, now):
                return [AcceptResult(event_id=event.event_id, session_key=event.session_key)]
            async with direct.connect(self.reader) as conn:
                return [await self._duplicate(conn, event)]
        results: list[AcceptResult] = []
        # One event is one statement (plus a read if it is a duplicate): no BEGIN/COMMIT.
        async with direct.connect(self.reader) if len(events) == 1 else self.engine.begin() as conn:
            for event in events:
                results.append(await self._insert(conn, event, now))
        for res in results:
            if not res.duplicate:
                self._stored(res.event_id, res.session_key)
        return results

    def _stored(self, event_id: str, session_key: str) -> None:
        """An event was stored: a waiter may wait for it, the dispatcher wakes for its key."""
        self._accepted(event_id)
        if self.on_accepted is not None:
            self.on_accepted(session_key)

    async def _insert_alone(self, event: InboundEvent, now: datetime) -> bool:
        """One event in a statement of its own (`GroupInsert`'s retry): whether it was stored."""
        async with direct.connect(self.reader) as conn:
            return await self._store(conn, event, now)

    async def _accept_claiming(self, event: InboundEvent, now: datetime, claimer: Claimer) -> AcceptResult:
        """`accept` of one event whose key has a run slot reserved: hand the slot on or back."""
        claim: Claim | None = None
        try:
            async with direct.connect(self.reader) as conn:
                result, claim = await self._insert_taking(conn, event, now, claimer)
        finally:
            if claim is None:
                claimer.unreserve(event.session_key)
        if not result.duplicate:
            self._accepted(result.event_id)
        if claim is not None:
            claimer.taken(event.session_key, *claim)
        elif not result.duplicate and self.on_accepted is not None:
            self.on_accepted(result.session_key)
        return result

    def _accepted(self, event_id: str) -> None:
        self._unhandled[event_id] = None
        if len(self._unhandled) > 10_000:
            self._unhandled.popitem(last=False)

    @staticmethod
    def _values(event: InboundEvent, now: datetime) -> dict[str, Any]:
        return dict(
            event_id=event.event_id,
            channel=event.channel,
            external_id=event.external_id,
            session_key=event.session_key,
            payload=event.model_dump(mode="json"),
            status="pending",
            attempts=0,
            created_at=now,
            updated_at=now,
        )

    async def _insert(self, conn: DirectConnection, event: InboundEvent, now: datetime) -> AcceptResult:
        if await self._store(conn, event, now):
            return AcceptResult(event_id=event.event_id, session_key=event.session_key)
        return await self._duplicate(conn, event)

    async def _store(self, conn: DirectConnection, event: InboundEvent, now: datetime) -> bool:
        """Insert the event unless it is a duplicate; whether it was stored."""
        values = self._values(event, now)
        if event.external_id is None:
            await _INSERT.rows(conn, values)
            return True
        return await _INSERT_NEW[conn.dialect.name].first(conn, values) is not None

    async def _duplicate(self, conn: DirectConnection, event: InboundEvent) -> AcceptResult:
        original = await _ORIGINAL.one(conn, {"ch": event.channel, "ext": event.external_id})
        return AcceptResult(
            event_id=original["event_id"], session_key=original["session_key"], duplicate=True
        )

    async def _insert_taking(
        self, conn: DirectConnection, event: InboundEvent, now: datetime, claimer: Claimer
    ) -> tuple[AcceptResult, Claim | None]:
        """`_insert`, also taking the key's lease if it is free (then the claim is not None)."""
        key = event.session_key
        params = self._values(event, now)
        plan = claimer.start_plan(event, now)
        if plan is not None:
            params = plan.accept_params(params)
        params.update(k=key, o=claimer.owner, exp=now + timedelta(seconds=claimer.lease_ttl))
        statement = claimer.accept_statement(dedup=event.external_id is not None, plan=plan)
        row = await statement.one(conn, params)
        lease = None if row["fence"] is None else SessionLease(key, claimer.owner, row["fence"])
        upcoming = None if row["upcoming"] is None else [InboxRow.of(r) for r in row["upcoming"]]
        if row["id"] is None:
            # A duplicate; with a plan the lease may have been taken all the same (a
            # duplicate committed after the statement's snapshot): its drain releases it.
            return await self._duplicate(conn, event), None if lease is None else (lease, upcoming)
        accepted = AcceptResult(event_id=event.event_id, session_key=key)
        if lease is None:
            return accepted, None
        rows = None
        if upcoming is not None:
            this = InboxRow(row["id"], event.event_id, event.channel, key, 0, event)
            if plan is not None and row["run_id"] is not None:
                this = replace(this, started=plan.started_on_accept(row))
            rows = [*upcoming, this][: claimer.rows_limit]
        return accepted, (lease, rows)

    # --- for the key's lease holder ----------------------------------------------

    async def next_rows(self, key: str, limit: int) -> list[InboxRow]:
        async with direct.connect(self.reader) as conn:
            rows = await _NEXT_ROWS.rows(conn, {"k": key, "limit": limit})
        return [InboxRow.of(r) for r in rows]

    @staticmethod
    async def mark(
        conn: AsyncConnection,
        row_ids: Sequence[int],
        status: str,
        *,
        run_id: int | None = None,
        error: str | None = None,
        bump_attempts: bool = False,
    ) -> None:
        values: dict[str, Any] = {"status": status, "updated_at": utcnow(), "ids": list(row_ids)}
        if run_id is not None:
            values["run_id"] = run_id
        if error is not None:
            values["error"] = error
        await conn.execute(_MARK_BUMP if bump_attempts else _MARK, values)

    async def claimable_keys(self, limit: int = 500) -> list[str]:
        """Keys with unfinished events whose lease is free or expired, longest waiting first."""
        async with self.reader.connect() as conn:
            rows = await conn.execute(_CLAIMABLE, {"now": utcnow(), "limit": limit})
            return [r[0] for r in rows]

    # --- waiting for replies (webhook ?wait=true, CLI) -----------------------------

    def wake(self, event_ids: Sequence[str], *, result: WaitResult | None = None) -> None:
        """The events were handled; `result`: what a waiter would read, known without asking."""
        for event_id in event_ids:
            self._unhandled.pop(event_id, None)
            waiter = self._waiters.get(event_id)
            if waiter is not None:
                if result is not None:
                    self._known[event_id] = result
                waiter.set()

    async def wait_for_replies(self, event_id: str, timeout: float, poll: float = 0.2) -> WaitResult:
        """Wait until the event is handled (here or on another replica) and return its replies."""
        waiter = self._waiters.setdefault(event_id, asyncio.Event())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        ask = event_id not in self._unhandled
        try:
            while True:
                result = self._known.pop(event_id, None)
                if result is None and ask:
                    result = await self._replies_if_done(event_id)
                if result is not None:
                    return result
                ask = True
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return WaitResult(done=False)
                try:
                    # Not `wait_for`: its extra task costs loop iterations after the wake-up.
                    async with asyncio.timeout(min(poll, remaining)):
                        await waiter.wait()
                except TimeoutError:
                    pass
                waiter.clear()
        finally:
            self._waiters.pop(event_id, None)
            self._known.pop(event_id, None)

    async def _replies_if_done(self, event_id: str) -> WaitResult | None:
        async with self.reader.connect() as conn:
            rows = (await conn.execute(_STATUS_AND_REPLIES, {"e": event_id})).mappings().all()
        if not rows or rows[0]["event_status"] in ACTIVE_STATUSES:
            return None
        return WaitResult(
            done=True,
            replies=[
                reply_of(r["message_id"], r["payload"], r["status"]) for r in rows if r["id"] is not None
            ],
        )


def reply_of(message_id: str, payload: dict[str, Any], status: str) -> Reply:
    """A reply as a waiter returns it, from its outbox row's message id, payload and status."""
    parts = payload.get("parts", [])
    text = "\n".join(p.get("text", "") for p in parts if p.get("type") == "text")
    return Reply(message_id=message_id, text=text, parts=parts, status=status)
