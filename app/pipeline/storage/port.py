"""The pipeline's storage port: every write (and the reads that go with them) of an event's way.

The pipeline talks to the database only through a `PipelineStore`. Two implementations
stand behind it, chosen once when the runtime is built (`app.pipeline.storage.build_store`):

- `PortableStore` (`portable.py`): SQLAlchemy transactions, one statement at a time; the
  store on SQLite, and a complete store on PostgreSQL too;
- `PostgresStore` (`postgres.py`): the same contract where the common cases are single
  statements (an event's turn starts and ends in one round trip each, events arriving
  together are inserted together, the key's next rows come with the statement that took
  its lease or ended its turn). It falls back to the portable code for everything else.

Whatever a method may read "for free" is optional in its result (`None`: not read); the
caller then reads it itself. So the pipeline behaves the same on every store, and the
pipeline's tests run against each.

Every write a worker makes for a key is fenced by its lease: it raises `LeaseLost`,
having written nothing, when the lease is no longer the key's current one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy.ext.asyncio import AsyncConnection

from app.channel import AcceptResult, WaitResult
from app.events import InboundEvent
from app.memory.store import Memory
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore


@dataclass(frozen=True)
class InboxRow:
    """An accepted event waiting for (or in) its turn."""

    id: int
    event_id: str
    channel: str
    session_key: str
    attempts: int  # attempts counted so far (`PipelineStore.count_attempt`)
    event: InboundEvent
    # Why the stored payload is no event (then `event` is a stand-in to reply to): such a
    # row is failed at once, never retried, and never holds its session up.
    unreadable: str | None = None
    trace_context: Mapping[str, Any] | None = None  # where its trace continues (app.tracing)

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> InboxRow:
        """From a row (or JSON object) of the inbox with these columns and `payload`."""
        payload = row["payload"]
        unreadable = None
        try:
            event = InboundEvent.model_validate(payload)
        except ValueError as exc:
            unreadable = f"the stored event cannot be read: {str(exc)[:500]}"
            event = _stand_in(row["channel"], payload)
        return cls(
            id=row["id"],
            event_id=row["event_id"],
            channel=row["channel"],
            session_key=row["session_key"],
            attempts=row["attempts"],
            event=event,
            unreadable=unreadable,
            trace_context=row.get("trace_context"),
        )


def _stand_in(channel: str, payload: Any) -> InboundEvent:
    """An event to reply to for a payload that is none: its chat, if that much can be read."""
    fields = payload if isinstance(payload, Mapping) else {}

    def text(name: str) -> str:
        value = fields.get(name)
        return value if isinstance(value, str) else ""

    return InboundEvent.model_construct(
        channel=channel,
        chat_id=text("chat_id"),
        sender_id=text("sender_id"),
        thread_id=text("thread_id") or None,
        parts=(),
        metadata={},
    )


@dataclass(frozen=True)
class Claim:
    """A key's lease, and its next unfinished rows when they were read with it (None: read them)."""

    lease: SessionLease
    rows: list[InboxRow] | None = None


@dataclass(frozen=True)
class Accepted:
    """What `accept` said: one result per event, and the lease it took if it was asked to."""

    results: list[AcceptResult]
    claim: Claim | None = None


@dataclass(frozen=True)
class Recall:
    """The memory recall a turn's start may read (`app.memory.recall.recall_query`)."""

    with_user: bool
    params: Mapping[str, Any]  # but the session id


@dataclass(frozen=True)
class TurnPlan:
    """The start of a turn: the rows it answers, the session it continues or opens, its run."""

    rows: Sequence[InboxRow]
    channel: str  # the conversation's channel (`replies.conversation_channel`)
    expire_after: float  # the channel's lifecycle: an idler current session is closed
    user_messages: Sequence[ChatMessage]  # one per row, in order
    run: Mapping[str, Any] | None  # the run row's values but its session; None: no answer due
    now: datetime
    window_limit: int | None  # the history window the run will read first
    recall: Recall | None = None  # read with the start where the store can; None: not asked


@dataclass(frozen=True)
class Started:
    session: SessionState  # as it is after the start (active, `next_seq` past what it added)
    run_id: int | None  # None: no answer was due, the rows are done
    added: list[ChatMessage]  # what the start appended (repairs of an open group, the user messages)
    seqs: list[int]
    # Read with the start where the store could (None: not read): the newest
    # `window_limit` messages after `last_consolidated` as stored, oldest first, the
    # start's own messages included; the memory recall when it was asked for.
    window: list[ChatMessage] | None = None
    recalled: list[Memory] | None = None
    watched: bool = True  # whether some replica's session bus may watch the key


@dataclass(frozen=True)
class Appended:
    seqs: list[int]
    watched: bool = True
    # The key's unfinished rows but the turn's own (`append(handled=…)`); None: not read.
    pending: list[InboxRow] | None = None


@dataclass(frozen=True)
class TurnEnd:
    """The end of a turn: the answer, its reply, its rows done, the run trace; one commit."""

    session_id: int
    answer: ChatMessage
    run_id: int
    reply: Mapping[str, Any]  # the outbox row (`replies.outbox_values`)
    inbox_ids: Sequence[int]
    link: int | None  # the run id the rows are linked to (None: leave them as they are)
    trace: Mapping[str, Any]  # the run row's new values
    now: datetime
    # Give the lease up in the same commit if the key has nothing else to do.
    release: bool = False
    # When it does: take the free lease of this key too (the next one waiting for the run slot).
    successor: str | None = None


@dataclass(frozen=True)
class Finished:
    seq: int  # the answer's
    watched: bool = True
    released: bool = False  # the lease was given up (asked to, and nothing was left)
    # The key's next unfinished rows after the ones it finished; None: not read.
    upcoming: list[InboxRow] | None = field(default=None)
    successor: Claim | None = None  # the successor's lease, when it was released and taken


class PipelineStore(Protocol):
    """Storage of the event's way (see the module). Writes for a key are fenced by its lease."""

    @property
    def sessions(self) -> SessionStore:
        """Session generations and history reads (`app.sessions.store`)."""
        ...

    # --- ingest ---------------------------------------------------------------------

    async def accept(self, events: Sequence[InboundEvent], *, claim_for: str | None = None) -> Accepted:
        """Store events (dedup on channel + external id) durably.

        `claim_for`: an owner that has a run slot for the (single) event's key: take the
        key's lease for it if it is free, in the same commit (`Accepted.claim`).
        """
        ...

    async def replies_if_done(self, event_id: str) -> WaitResult | None:
        """The event's replies once it is handled (done or failed); None while it is not."""
        ...

    async def claimable_keys(self, limit: int) -> list[str]:
        """Keys with unfinished rows whose lease is free or expired, longest waiting first."""
        ...

    # --- leases -------------------------------------------------------------------

    async def take(self, key: str, owner: str) -> Claim | None:
        """The key's lease if it is free, expired or ours (None: held by another)."""
        ...

    async def renew(self, lease: SessionLease) -> bool: ...

    async def release(self, lease: SessionLease) -> bool:
        """Give the lease up; returns whether the key still has unfinished rows."""
        ...

    async def next_rows(self, key: str, limit: int) -> list[InboxRow]:
        """The key's unfinished rows in the order they are handled."""
        ...

    # --- a turn, under the key's lease --------------------------------------------

    def fenced(self, lease: SessionLease) -> AbstractAsyncContextManager[AsyncConnection]:
        """A transaction whose first statement checked the lease: for rare writes (commands)."""
        ...

    async def count_attempt(self, lease: SessionLease, row_ids: Sequence[int]) -> list[int]:
        """Mark the rows `processing` and count an attempt, committed before the attempt runs.

        Returns the ids counted: a row that is no longer unfinished (canceled while it
        waited, `app.db.models.CANCELED`) is left as it is and must not run."""
        ...

    async def note_error(self, row_ids: Sequence[int], error: str) -> None:
        """Keep an attempt's error with its rows (they stay unfinished)."""
        ...

    async def fail(
        self, lease: SessionLease, rows: Sequence[InboxRow], reason: str, replies: Sequence[Mapping[str, Any]]
    ) -> None:
        """Give up on rows: `failed` with `reason` and their last noted error, and the outbox
        rows telling their senders (left out if the database cannot store them)."""
        ...

    async def start(self, lease: SessionLease, plan: TurnPlan) -> Started: ...

    async def append(
        self,
        lease: SessionLease,
        session_id: int,
        new: Sequence[ChatMessage],
        *,
        run_id: int | None,
        handled: Sequence[int] | None = None,
    ) -> Appended:
        """Append messages during a run; with `handled` (the turn's row ids) the store may
        also read the key's other unfinished rows (`Appended.pending`)."""
        ...

    async def finish(self, lease: SessionLease, end: TurnEnd) -> Finished: ...

    async def run_row(self, run_id: int) -> tuple[list[str], dict[str, Any], datetime]:
        """A run's event ids, details and start, as stored (a resumed run's trace builds on them)."""
        ...
