"""The pipeline's storage port: every write (and the reads that go with them) of an event's way.

The pipeline talks to the database only through a `PipelineStore`. Two implementations
stand behind it, chosen once when the runtime is built (`app.pipeline.storage.build_store`):

- `PortableStore` (`portable.py`): SQLAlchemy transactions, one statement at a time; the
  store on SQLite, and a complete store on PostgreSQL too;
- `SqliteStore` (`sqlite.py`): on a SQLite file, the common cases are one transaction
  each, run whole in a thread of its own without a hop per statement; the portable code
  for everything else;
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

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from app.channel import AcceptResult, WaitResult
from app.events import InboundEvent, OutboundMessage
from app.memory.store import Memory
from app.pipeline.approvals import ApprovalRules, Decided, NoDecision
from app.pipeline.storage.native_reads import RefEvent, SentReply
from app.pipeline.storage.records import (
    Answer,
    ApprovalRequest,
    Injected,
    MetadataChange,
    OpenSession,
    OutboxClaim,
    PaceGrant,
    PaceTake,
    PausedRun,
)
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
    # Count the rows' attempt in the start's own commit (the handler has not called
    # `count_attempt`): one commit less per turn. A row canceled meanwhile makes the start
    # raise `RowsCanceled` having written nothing; a start that fails writes no count either
    # (the caller then counts it with `count_attempt`).
    count_attempt: bool = False


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

    async def close(self) -> None:
        """Give up what the store holds of its own (before the engine is disposed)."""

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

    async def reclaim_expired(self, limit: int) -> list[str]:
        """Free every expired lease of a key with unfinished rows (a dead replica's), at most
        `limit`, in one statement; returns those keys (`app.pipeline.storage.reclaim`)."""
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

    async def inject(
        self,
        lease: SessionLease,
        session_id: int,
        rows: Sequence[InboxRow],
        messages: Sequence[ChatMessage],
        *,
        run_id: int | None,
    ) -> Injected:
        """Steered rows join the running turn `run_id`: an attempt counted (not for a row
        canceled meanwhile) and their user messages (one per row) appended, in one commit."""
        ...

    async def pause_for_approval(
        self,
        lease: SessionLease,
        request: ApprovalRequest,
        answer: Callable[[int], Answer],
        trace: Mapping[str, Any],
    ) -> int:
        """Store a pending approval, the turn's answer (`answer(approval id)`: the question)
        and the run's trace in one commit; returns the approval's id."""
        ...

    async def next_generation(
        self,
        lease: SessionLease,
        old: SessionState,
        channel: str,
        *,
        reason: str,
        run_id: int | None = None,
        carry: Sequence[ChatMessage] = (),
        answer: Callable[[SessionState, int], Answer] | None = None,
    ) -> tuple[SessionState, int, list[int]]:
        """Continue the key in a new generation linked to `old` (`app.memory.generations`),
        starting with `carry`; returns it, how many summaries it carries, `carry`'s seqs."""
        ...

    # --- commands, under the key's lease -------------------------------------------

    async def answer(self, lease: SessionLease, answer: Answer) -> None:
        """Answer a command: its rows done and its replies, in one fenced commit."""
        ...

    async def open_session(self, lease: SessionLease, channel: str) -> OpenSession:
        """The key's open session (a new generation if none), its title and pending approvals."""
        ...

    async def close_session(self, lease: SessionLease, *, by: str, answer: Answer) -> SessionState | None:
        """Expire the key's open session (/new /reset /end; history stays) and cancel its
        pending approvals; returns the session closed (None: none was open)."""
        ...

    async def set_session_metadata(
        self,
        lease: SessionLease,
        channel: str,
        change: MetadataChange | None = None,
        *,
        title: str | None = None,
        answer: Answer | None = None,
    ) -> SessionState:
        """Change the open session's metadata (read fresh: a tool may have written it) and/or
        title; returns the session as it is now."""
        ...

    async def generations(self, key: str, limit: int) -> list[dict[str, Any]]:
        """The key's newest generations: id, generation, title, status, next_seq, metadata."""
        ...

    async def paused_run(self, lease: SessionLease, channel: str) -> tuple[SessionState, PausedRun | None]:
        """The key's open session (a new generation if none) and its run that waits for an
        approval, if any."""
        ...

    async def stop_paused_run(
        self, lease: SessionLease, paused: PausedRun, *, by: str, final: ChatMessage, answer: Answer
    ) -> None:
        """End a paused run (/stop): its open calls closed, `final` appended, answered."""
        ...

    async def decide_approval(
        self,
        lease: SessionLease,
        event: InboundEvent,
        command: str,
        channel: str,
        rules: ApprovalRules,
        answer: Callable[[NoDecision], Answer],
    ) -> Decided | NoDecision:
        """Check and store an `/approve` or `/deny` (`app.pipeline.approvals.decide`); when
        nothing continues, `answer(outcome)` answers the command in the same commit."""
        ...

    # --- platform-native events (`native_reads.py`) ----------------------------------

    async def inbox_by_ref(self, key: str, refs: Sequence[str]) -> dict[str, RefEvent]:
        """The key's newest events carrying these platform message ids (`MESSAGE_REF_KEY`)."""
        ...

    async def sent_replies(self, event_id: str) -> list[SentReply]:
        """The replies to `event_id` that reached the platform, oldest first."""
        ...

    async def reply_by_platform_id(self, key: str, platform_message_id: str) -> OutboundMessage | None:
        """The reply of ours in session `key` the platform knows as `platform_message_id`."""
        ...

    # --- the outbox -------------------------------------------------------------------

    async def claim_outbox(self, claim: OutboxClaim) -> list[Any]:
        """Claim due outbox rows (`OutboxClaim`), oldest first, as rows of the outbox
        (indexable by column name); replicas claiming at once pass over each other's rows.
        Rows still claimed by `claim.owner` are due to it at once (its earlier claim
        committed but the answer never reached it); other owners wait for the deadline."""
        ...

    # --- outbound pacing (`app.pipeline.pacing`) ---------------------------------------

    async def take_pace(self, take: PaceTake) -> PaceGrant:
        """A slot for one send from its token buckets, shared by every replica (`PaceTake`)."""
        ...

    async def pause_pace(self, names: Sequence[str], until: float) -> None:
        """No send from these buckets before `until` (unix seconds): a platform's `retry_after`."""
        ...

    async def release_pace(self, names: Sequence[str], held_until: float) -> None:
        """A granted send was answered: free its exclusive buckets (`PaceGrant.held_until`)."""
        ...

    async def pace_paused(self, names: Sequence[str]) -> float:
        """The latest pause of these buckets (unix seconds; 0 when none)."""
        ...

    async def prune_pace(self, idle_before: float) -> int:
        """Delete buckets with nothing after `idle_before` (such a bucket is as good as
        none); how many went."""
        ...
