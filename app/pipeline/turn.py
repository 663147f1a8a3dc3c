"""One turn of one session: commands, user messages, the agent run, the replies.

Every write goes through `_fenced`, which checks the key's lease fence in the same
transaction; the final answer, its outbox rows, the run trace and the inbox status
commit together, so a crash either leaves the turn to be resumed or finished. Watchers
(the browser gateway) learn about each commit on the session bus, after the commit.

Besides the session commands (/new /reset /end) a turn understands:

- `/stop`: cancels the running turn (see `RunControl`) or a run waiting for approval;
- `/approve <id>` and `/deny <id>`: decide a risky tool call; the run that asked
  continues in this turn (who may decide and how a decision is stored:
  `app.pipeline.approvals`).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

import structlog
from sqlalchemy import bindparam, func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.loop import (
    INTERRUPTED_RESULT,
    STOPPED_TEXT,
    AgentRunner,
    Decision,
    RunHooks,
    RunRecord,
    StopRequest,
    denied_result,
    open_calls,
)
from app.agent.policy import ToolPolicy
from app.agent.tools import ToolContext
from app.bus import SessionBus
from app.channel import ChannelSettings, WaitResult
from app.db import direct
from app.db.models import approvals, messages, runs, utcnow
from app.errors import LeaseLost
from app.events import BusyPolicy, InboundEvent, OutboundMessage
from app.memory.recall import RECALLED, MemoryRecall
from app.memory.store import Memory
from app.pipeline import fused
from app.pipeline.approvals import (
    ApprovalRules,
    Decided,
    call_name_and_arguments,
    cancel_pending,
    decide,
    insert_request,
    question_text,
    timeout_events,
)
from app.pipeline.inbox import Inbox, InboxRow, reply_of
from app.pipeline.replies import (
    SESSION_COMMANDS,
    command_of,
    conversation_channel,
    insert_outbox_row,
    is_command,
    outbox_values,
    reply_for,
    user_message,
)
from app.sessions.lease import SessionLease, check_fence
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore, message_from_row, message_values
from app.sessions.window import trim_to_legal_window

log = structlog.get_logger(__name__)


AfterTurn = Callable[[SessionLease, SessionState], Awaitable[None]]
"""Runs after a turn finished, still under the key's lease (e.g. memory consolidation)."""


@dataclass(frozen=True)
class WindowLimits:
    max_messages: int | None
    max_tokens: int | None


# Built once: every turn runs them (the values come with the parameters).
_INSERT_RUN = runs.insert().returning(runs.c.id)
_UPDATE_RUN = update(runs).where(runs.c.id == bindparam("run_id_"))


RunRow = tuple[list[str], dict[str, Any], datetime]
"""A run row's event ids, details and start, as stored."""

_Started = tuple[SessionState, int | None, RunRow | None, list[ChatMessage], list[int]]
"""A started turn: its session, run id and row (None: no answer due), the user messages and seqs."""


@dataclass(frozen=True)
class _FirstRead:
    """What a one-statement start read for the run: its stored window and memory recall."""

    stored: list[ChatMessage]  # the newest messages after `last_consolidated`, as stored
    recalled: list[Memory] | None  # None: not read (memory is off)
    watched: bool  # some replica's session bus watches the key (`fused.Started.watched`)


@dataclass
class _Turn:
    """The mutable state of one turn: which inbox rows it answers, where the reply goes."""

    lease: SessionLease
    session: SessionState
    rows: list[InboxRow]
    run_id: int
    origin: InboundEvent  # whose request the run serves (tool context, policy)
    reply_to: InboundEvent  # the event the final answer replies to
    run_started: float = field(default_factory=time.monotonic)
    # A run resumed by /approve already has replies (the question): its new inbox rows are
    # not linked by run id, so waiting clients get only the replies to their own event.
    # Otherwise the run is this turn's own, and its answer is the run's only reply.
    link_rows: bool = True
    run_row: RunRow | None = None  # None: read it when saving
    # The session's newest messages after `last_consolidated` as stored, oldest first: read
    # by the turn's one-statement start (`_FirstRead`), then kept up to date with what the
    # turn appends. The turn holds the key's lease, so nobody else appends meanwhile, and
    # `load_window` trims this instead of reading the same rows again. None: read them.
    stored: list[ChatMessage] | None = None
    recalled: list[Memory] | None = None
    # Read by the turn's one-statement end: the key's next unfinished rows (`prefetch`).
    upcoming: list[InboxRow] | None = None
    # The key's unfinished rows but the turn's own, as the latest append read them (a tool
    # result's, `fused.append`): what the boundary after the group looks at. None: read them.
    pending: list[InboxRow] | None = None
    # Whether another replica may watch the key, as its latest one-statement write saw it
    # (`app.gateway.pg_bus`): if not, its messages and deltas are not NOTIFYed.
    watched: bool = True
    # Whether the turn's one-statement end may release the lease when nothing is left to
    # do for the key, and whether it did (`fused.finish`).
    may_release: bool = False
    released: bool = False
    # Who gets the run slot if the turn's end releases the lease (`Handoff`); used once.
    handoff: Handoff | None = None

    @property
    def handled_ids(self) -> set[int]:
        return {r.id for r in self.rows}


class Handoff(Protocol):
    """Who gets the run slot that a turn's end frees by releasing its key (the dispatcher).

    A releasing one-statement end asks `pick` for the next key waiting for a slot; the
    statement takes that key's lease if ours is released (`fused.finish(successor=)`),
    and `took` gets the statement's result. A picked key whose statement failed gets no
    `took`: the dispatcher puts it back in line.
    """

    def pick(self) -> fused.Successor | None: ...

    def took(self, finished: fused.Finished) -> None: ...


@dataclass(frozen=True)
class Handled:
    """What a turn leaves its key's worker.

    `upcoming`: the key's next rows as the turn's end read them (None: not read).
    `released`: the turn's end released the lease, the key having nothing left to do:
    the worker must neither write under it nor release it again.
    """

    upcoming: list[InboxRow] | None = None
    released: bool = False


# How many keys `TurnHandler` remembers as recently started (`_recent`).
_RECENT_KEYS = 10_000


class TurnHandler:
    def __init__(
        self,
        engine: AsyncEngine,
        store: SessionStore,
        inbox: Inbox,
        runner: AgentRunner,
        *,
        limits: WindowLimits,
        max_attempts: int,
        models: Mapping[str, str | None] | None = None,
        on_outbox: Callable[[], None] | None = None,
        delivers: Callable[[str], bool] | None = None,
        bus: SessionBus | None = None,
        after_turn: Sequence[AfterTurn] = (),
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        tools_allow: Sequence[str] = (),
        tools_deny: Sequence[str] = (),
        approval_timeout: float = 300.0,
        stop_poll: float = 1.0,
        on_run_finished: Callable[[str, float, str], None] | None = None,
        recall: MemoryRecall | None = None,
    ) -> None:
        self.engine = engine
        self.recall = recall  # read with a turn's one-statement start
        self.on_run_finished = on_run_finished
        self.store = store
        self.inbox = inbox
        self.runner = runner
        self.limits = limits
        self.max_attempts = max_attempts
        self.models = dict(models or {})
        self.on_outbox = on_outbox or (lambda: None)
        # Whether a channel's replies need sending (`OutboxSender.delivers`); if not, they
        # are stored as sent and the sender is not woken for them.
        self.delivers = delivers or (lambda channel: True)
        self.bus = bus
        self.after_turn = list(after_turn)
        self.channel_settings = dict(channel_settings or {})
        self.tools_allow = list(tools_allow)
        self.tools_deny = list(tools_deny)
        self.approval_timeout = approval_timeout
        self.approval_rules = ApprovalRules(self.channel_settings)
        self.stop_poll = stop_poll
        self._input_signals: dict[str, asyncio.Event] = {}
        # PostgreSQL writes a turn's start and end as one statement each (`fused`).
        self._one_statement = engine.dialect.name == "postgresql"
        # Keys whose turn this process started lately: their session's channel and when it
        # was last active. Only these get a start planned with their accept (`start_plan`):
        # for other keys the accept would most likely find no session to continue, and the
        # bigger statement would cost more than it saves.
        self._recent: OrderedDict[str, tuple[str, datetime]] = OrderedDict()

    # --- entry points -------------------------------------------------------------

    def input_arrived(self, key: str) -> None:
        """An event for `key` was accepted in this process while its worker is busy."""
        signal = self._input_signals.get(key)
        if signal is not None:
            signal.set()

    async def _insert_reply(
        self,
        conn: AsyncConnection,
        message: OutboundMessage,
        *,
        session_id: int | None,
        run_id: int | None,
        event_id: str | None,
    ) -> None:
        await insert_outbox_row(
            conn, self._reply_row(message, session_id=session_id, run_id=run_id, event_id=event_id)
        )

    def _reply_row(
        self, message: OutboundMessage, *, session_id: int | None, run_id: int | None, event_id: str | None
    ) -> dict[str, Any]:
        """Its outbox row: stored as sent when the message's channel has nothing to send."""
        return outbox_values(
            message,
            session_id=session_id,
            run_id=run_id,
            event_id=event_id,
            sent=not self.delivers(message.channel),
        )

    @asynccontextmanager
    async def _fenced(self, lease: SessionLease) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            yield conn

    async def handle(
        self, lease: SessionLease, rows: Sequence[InboxRow], *, handoff: Handoff | None = None
    ) -> Handled:
        """Handle a batch of the key's events as one turn (one event unless `collect`).

        Returns the key's next unfinished rows when the turn's last statement read them
        (`app.pipeline.prefetch`), and whether that statement released the lease (then
        it may have handed the worker's run slot on through `handoff`).
        """
        live: list[InboxRow] = []
        poisoned: list[InboxRow] = []
        for row in rows:
            (poisoned if row.attempts >= self.max_attempts else live).append(row)
        if poisoned:
            await self._fail(lease, poisoned)
        if not live:
            return Handled()
        events = [r.event for r in live]
        last = events[-1]
        command = command_of(last)
        if len(events) == 1 and command in SESSION_COMMANDS:
            self._recent.pop(lease.key, None)
            await self._session_command(lease, live[0], command)
            return Handled()
        if len(events) == 1 and command == "/stop":
            await self._stop_command(lease, live[0])
            return Handled()
        if len(events) == 1 and command in ("/approve", "/deny"):
            await self._decision_command(lease, live[0], command)
            return Handled()
        self._input_signals.setdefault(lease.key, asyncio.Event())
        try:
            return await self._agent_turn(lease, live, handoff)
        finally:
            self._input_signals.pop(lease.key, None)

    # --- a normal turn --------------------------------------------------------------

    async def _agent_turn(
        self, lease: SessionLease, live: list[InboxRow], handoff: Handoff | None
    ) -> Handled:
        events = [r.event for r in live]
        last = events[-1]
        answer = not all(e.metadata.get("no_reply") for e in events)
        started, read = None, None
        if len(live) == 1 and live[0].started is not None:
            started, read = self._adopt(lease, last, live[0].started)
        elif self._one_statement and answer and len(live) == 1 and live[0].attempts == 0:
            started, read = await self._start_in_one_statement(lease, live[0])
        if started is not None:
            session, run_id, run_row, added, seqs = started
        else:
            session, run_id, run_row, added, seqs = await self._start(lease, live, answer)
        watched = read.watched if read is not None else True
        self._started(lease.key, session)
        await self._publish(lease.key, session.id, added, seqs, remote=watched)
        if run_id is None:
            self.inbox.wake([e.event_id for e in events])
            return Handled()
        turn = _Turn(
            lease=lease,
            session=session,
            rows=list(live),
            run_id=run_id,
            origin=last,
            reply_to=last,
            run_row=run_row,
            stored=read.stored if read is not None else None,
            recalled=read.recalled if read is not None else None,
            watched=watched,
            may_release=True,
            handoff=handoff,
        )
        record = RunRecord(provider=self.runner.provider.name, model=self.models.get(last.channel))
        record = await self.runner.resume(
            self._hooks(turn), self._tool_context(turn), record, calls=(), decisions={}, model=record.model
        )
        # A released lease means no after-turn hook was due (`_finish`).
        if record.outcome != "awaiting_approval" and not turn.released:
            await self._after_turn(lease, turn.session)
        return Handled(turn.upcoming, turn.released)

    def start_plan(self, event: InboundEvent, now: datetime) -> fused.StartPlan | None:
        """The one-statement start of the plain turn `event` begins if it is next, for the
        statement accepting it (`app.pipeline.accept_start`); None for anything else."""
        if not self._one_statement or is_command(event) or event.metadata.get("no_reply"):
            return None
        recent = self._recent.get(event.session_key)
        channel = conversation_channel(event)
        if recent is None or recent[0] != channel:
            return None
        if (now - recent[1]).total_seconds() > self.store.lifecycle(channel).expire_after:
            return None
        return self._plan(event, event.session_key, now, channel)

    def _started(self, key: str, session: SessionState) -> None:
        """A turn of `key` started in `session`, which it made active now (see `_recent`)."""
        self._recent[key] = (session.channel, utcnow())
        self._recent.move_to_end(key)
        if len(self._recent) > _RECENT_KEYS:
            self._recent.popitem(last=False)

    def _plan(self, event: InboundEvent, key: str, now: datetime, channel: str) -> fused.StartPlan:
        """`event`'s start (`fused.plan_start`); `channel`: its `conversation_channel`."""
        run, _ = self._run_values(key, [event], now)
        recall = None
        if self.recall is not None:
            with_user, params = self.recall.recall_params(
                event.channel, event.chat_type.value, key, event.sender_id
            )
            recall = fused.Recall(with_user, params)
        return fused.plan_start(
            channel=channel,
            cutoff=now - timedelta(seconds=self.store.lifecycle(channel).expire_after),
            now=now,
            message=message_values(user_message(event), None),
            run=run,
            window_limit=self.limits.max_messages,
            recall=recall,
        )

    async def _start_in_one_statement(
        self, lease: SessionLease, row: InboxRow
    ) -> tuple[_Started, _FirstRead] | tuple[None, None]:
        """The common start (see `fused.start`) on PostgreSQL; (None, None): take the general path.

        The statement also reads the run's first history window and memory recall.
        """
        plan = self._plan(row.event, lease.key, utcnow(), conversation_channel(row.event))
        async with direct.connect(self.store.reader) as conn:
            started = await fused.start(conn, lease, row.id, plan)
        if started is None:
            return None, None
        return self._adopt(lease, row.event, started)

    def _adopt(
        self, lease: SessionLease, event: InboundEvent, started: fused.Started
    ) -> tuple[_Started, _FirstRead]:
        """A turn started in one statement, its own (`fused.start`) or its event's accept."""
        self.store.remember(lease.key, started.session, fence=lease.fence)
        user = user_message(event)
        _, run_row = self._run_values(lease.key, [event], started.started_at)
        read = _FirstRead(
            stored=fused.stored_window(started, user), recalled=started.recalled, watched=started.watched
        )
        return (started.session, started.run_id, run_row, [user], [started.seq]), read

    async def _start(self, lease: SessionLease, live: list[InboxRow], answer: bool) -> _Started:
        """Start a turn in a transaction: any batch, retries, repairs, a new generation."""
        events = [r.event for r in live]
        last = events[-1]
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [r.id for r in live], "processing", bump_attempts=True)
            if any(r.attempts for r in live):
                # A retry: the run an earlier attempt started died with its worker.
                await conn.execute(
                    update(runs)
                    .where(runs.c.session_key == lease.key, runs.c.outcome == "running")
                    .values(
                        outcome="crashed", error="the worker stopped during the run", finished_at=utcnow()
                    )
                )
            session = await self.store.open_current(
                conn, lease.key, conversation_channel(last), fence=lease.fence
            )
            # Close a tool-call group a crash or a pending approval left open *before* the
            # new user message, so the history stays one legal trajectory.
            repairs = await self._close_open_group(conn, session, reason="a new message arrived first")
            # Only a retry (attempts > 0: an earlier transaction marked the row) can have
            # appended the event's message already.
            new_user = [
                user_message(r.event)
                for r in live
                if r.attempts == 0 or not await self.store.has_event(conn, session.id, r.event_id)
            ]
            added = [*repairs, *new_user]
            seqs = await self.store.append(conn, session.id, added)
            run_id: int | None = None
            run_row: RunRow | None = None
            if answer:
                run, run_row = self._run_values(lease.key, events, utcnow())
                run_id = int(
                    (await conn.execute(_INSERT_RUN, {**run, "session_id": session.id})).scalar_one()
                )
            else:
                await Inbox.mark(conn, [r.id for r in live], "done")
        return session, run_id, run_row, added, seqs

    def _run_values(
        self, key: str, events: Sequence[InboundEvent], now: datetime
    ) -> tuple[dict[str, Any], RunRow]:
        """A new run row's values but its session id, and what the turn keeps of them."""
        event_ids = [e.event_id for e in events]
        details = {"origin_event_id": events[-1].event_id, "requester": events[-1].sender_id}
        values = dict(
            session_key=key,
            event_ids=event_ids,
            provider=self.runner.provider.name,
            model=self.models.get(events[-1].channel),
            tool_calls=[],
            started_at=now,
            outcome="running",
            details=details,
            iterations=0,
            prompt_tokens=0,
            completion_tokens=0,
        )
        return values, (event_ids, details, now)

    async def _close_open_group(
        self, conn: AsyncConnection, session: SessionState, *, reason: str, by: str = "superseded"
    ) -> list[ChatMessage]:
        """Results for the newest group's unanswered calls; cancels their pending approvals."""
        if session.tail_open is False:
            return []  # read with the session: the last turn ended with an answer
        last = (
            await conn.execute(
                select(messages.c.role, messages.c.tool_calls)
                .where(messages.c.session_id == session.id)
                .order_by(messages.c.seq.desc())
                .limit(1)
            )
        ).first()
        if last is None or not (last.role == "tool" or (last.role == "assistant" and last.tool_calls)):
            return []  # the common case: the last turn ended with an answer
        tail = await self.store.tail(session.id, 64, conn=conn)
        pending = open_calls(tail)
        if not pending:
            return []
        cancelled = await cancel_pending(conn, session.id, by)
        cancelled_ids = {r.tool_call_id for r in cancelled}
        for run_id in {r.run_id for r in cancelled if r.run_id is not None}:
            await self._amend_run(
                conn,
                run_id,
                outcome="stopped" if by != "superseded" else "superseded",
                add_calls=[
                    {
                        "id": r.tool_call_id,
                        "name": r.tool_name,
                        "ms": 0,
                        "decision": "cancelled",
                        "decided_by": by,
                    }
                    for r in cancelled
                    if r.run_id == run_id
                ],
                finished=True,
            )
        return [
            ChatMessage(
                role="tool",
                content=denied_result(reason) if call["id"] in cancelled_ids else INTERRUPTED_RESULT,
                tool_call_id=call["id"],
                name=call.get("function", {}).get("name", ""),
            )
            for call in pending
        ]

    # --- the hooks the run loop calls -----------------------------------------------

    def _tool_context(self, turn: _Turn) -> ToolContext:
        origin = turn.origin
        return ToolContext(
            session_id=turn.session.id,
            session_key=turn.lease.key,
            channel=origin.channel,
            chat_id=origin.chat_id,
            sender_id=origin.sender_id,
            thread_id=origin.thread_id,
            message_count=lambda: self._message_count(turn.session.id),
            policy=ToolPolicy.build(
                allow=self.tools_allow,
                deny=self.tools_deny,
                channel=self.channel_settings.get(origin.channel),
                sender_id=origin.sender_id,
            ),
            chat_type=origin.chat_type.value,
            extras={RECALLED: turn.recalled} if turn.recalled is not None else {},
        )

    def _hooks(self, turn: _Turn) -> RunHooks:
        lease, session = turn.lease, turn.session

        async def load_window() -> list[ChatMessage]:
            limits = self.limits
            if turn.stored is not None:  # what `SessionStore.load_window` would read now
                return trim_to_legal_window(
                    turn.stored, max_messages=limits.max_messages, max_tokens=limits.max_tokens
                )
            return await self.store.load_window(
                session, max_messages=limits.max_messages, max_tokens=limits.max_tokens
            )

        async def append(new: list[ChatMessage]) -> None:
            if self._one_statement and len(new) == 1:
                # The model's tool calls are redone if a database crash loses them (the
                # run is retried); tool results record what a tool did and wait for the
                # disk, which also flushes the calls before them.
                lax = new[0].role == "assistant" and bool(new[0].tool_calls)
                # A tool result may be the group's last: it reads what the boundary after
                # the group looks at (`_at_boundary`).
                handled = turn.handled_ids if new[0].role == "tool" else None
                async with direct.connect(self.store.reader) as conn:
                    appended = await fused.append(
                        conn,
                        lease,
                        session_id=session.id,
                        now=utcnow(),
                        message=message_values(new[0], turn.run_id),
                        lax=lax,
                        handled=None if handled is None else sorted(handled),
                    )
                seqs, turn.watched, turn.pending = [appended.seq], appended.watched, appended.pending
            else:
                async with self._fenced(lease) as conn:
                    seqs = await self.store.append(conn, session.id, new, run_id=turn.run_id)
                turn.watched, turn.pending = True, None
            self._stored(turn, new, seqs)
            await self._publish(lease.key, session.id, new, seqs, run_id=turn.run_id, remote=turn.watched)

        async def finish(final: ChatMessage, record: RunRecord) -> None:
            await self._finish(turn, final, record, reply_to=turn.reply_to, extra=())

        async def stopped(final: ChatMessage, record: RunRecord, stop: StopRequest) -> None:
            stop_rows = [r for r in await self.inbox.next_rows(lease.key, limit=200) if r.id == stop.row_id]
            reply_to = stop_rows[0].event if stop_rows else turn.reply_to
            await self._finish(turn, final, record, reply_to=reply_to, extra=stop_rows)

        async def on_delta(text: str) -> None:
            assert self.bus is not None
            await self.bus.publish(
                lease.key,
                {"type": "delta", "session_key": lease.key, "run_id": turn.run_id, "text": text},
                remote=turn.watched,
            )

        async def at_boundary() -> StopRequest | None:
            return await self._at_boundary(turn)

        async def wait_stop() -> StopRequest:
            return await self._wait_stop(turn)

        async def gate(call: dict[str, Any], ctx: ToolContext) -> Decision:
            return self.approval_rules.gate(turn.origin)

        async def pause(call: dict[str, Any], record: RunRecord) -> None:
            await self._pause(turn, call, record)

        return RunHooks(
            load_window=load_window,
            append=append,
            finish=finish,
            on_delta=on_delta if self.bus is not None else None,
            at_boundary=at_boundary,
            wait_stop=wait_stop,
            stopped=stopped,
            gate=gate,
            pause=pause,
        )

    def _stored(self, turn: _Turn, new: Sequence[ChatMessage], seqs: Sequence[int]) -> None:
        """Add messages the turn appended to `turn.stored`, as a read would return them."""
        if turn.stored is None:
            return
        turn.stored.extend(
            message_from_row({**message_values(m, turn.run_id), "seq": seq})
            for m, seq in zip(new, seqs, strict=True)
        )
        limit = self.limits.max_messages
        if limit is not None and len(turn.stored) > limit:
            del turn.stored[:-limit]  # a read takes the newest `max_messages` only

    async def _finish(
        self,
        turn: _Turn,
        final: ChatMessage,
        record: RunRecord,
        *,
        reply_to: InboundEvent,
        extra: Sequence[InboxRow],
    ) -> None:
        lease, session = turn.lease, turn.session
        reply = reply_for(reply_to, final.content or "")
        rows = [*turn.rows, *extra]
        link = turn.run_id if turn.link_rows else None
        outbox_row = self._reply_row(
            reply, session_id=session.id, run_id=turn.run_id, event_id=reply_to.event_id
        )
        if self._one_statement:
            if turn.run_row is None:  # a resumed run: its row was not read by this turn
                async with self.store.reader.connect() as conn:
                    await self._read_run_row(conn, turn)
            # The answer will be the session's newest message (seq `next_seq`).
            after = replace(session, next_seq=session.next_seq + 1)
            release = turn.may_release and not self._after_turn_due(after)
            handoff, turn.handoff = turn.handoff, None
            successor = handoff.pick() if release and handoff is not None else None
            async with direct.connect(self.store.reader) as conn:
                now = outbox_row["created_at"]
                trace = self._run_trace(turn, record, finished=True, now=now)
                finished = await fused.finish(
                    conn,
                    lease,
                    session_id=session.id,
                    now=now,
                    message=message_values(final, turn.run_id),
                    reply=outbox_row,
                    inbox_ids=[r.id for r in rows],
                    link=link,
                    run_id=turn.run_id,
                    trace=trace,
                    release=release,
                    successor=successor,
                )
            if successor is not None:
                assert handoff is not None
                handoff.took(finished)
            self._run_saved(turn, record, trace, finished=True)
            seqs, turn.watched, turn.upcoming = [finished.seq], finished.watched, finished.upcoming
            turn.released = finished.released
        else:
            async with self._fenced(lease) as conn:
                seqs = await self.store.append(conn, session.id, [final], run_id=turn.run_id)
                await insert_outbox_row(conn, outbox_row)
                await Inbox.mark(conn, [r.id for r in rows], "done", run_id=link)
                await self._save_run(conn, turn, record, finished=True)
            turn.watched = True
        # The answer is the session's newest message: the after-turn hooks count from it.
        turn.session = replace(session, next_seq=seqs[-1] + 1)
        known = None
        if turn.link_rows and not extra:
            # Exactly what the waiter's read would return now: no second look needed.
            answer = reply_of(outbox_row["message_id"], outbox_row["payload"], outbox_row["status"])
            known = WaitResult(done=True, replies=[answer])
        self.inbox.wake([r.event_id for r in rows], result=known)
        if known is not None:
            await asyncio.sleep(0)  # the woken waiters answer before the after-turn work
        if outbox_row["status"] == "pending":
            self.on_outbox()
        await self._publish(lease.key, session.id, [final], seqs, run_id=turn.run_id, remote=turn.watched)

    async def _save_run(
        self, conn: AsyncConnection, turn: _Turn, record: RunRecord, *, finished: bool
    ) -> None:
        if turn.run_row is None:
            await self._read_run_row(conn, turn)
        values = self._run_trace(turn, record, finished=finished, now=utcnow())
        await conn.execute(_UPDATE_RUN, {**values, "run_id_": turn.run_id})
        self._run_saved(turn, record, values, finished=finished)

    @staticmethod
    async def _read_run_row(conn: AsyncConnection, turn: _Turn) -> None:
        stored = (
            await conn.execute(
                select(runs.c.event_ids, runs.c.details, runs.c.started_at).where(runs.c.id == turn.run_id)
            )
        ).one()
        turn.run_row = (list(stored.event_ids or []), dict(stored.details or {}), stored.started_at)

    @staticmethod
    def _run_trace(turn: _Turn, record: RunRecord, *, finished: bool, now: datetime) -> dict[str, Any]:
        """The run row's new values (`turn.run_row` must be known)."""
        assert turn.run_row is not None
        stored_ids, stored_details, started_at = turn.run_row
        values: dict[str, Any] = dict(
            model=record.model,
            tool_calls=record.tool_calls,
            iterations=record.iterations,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            outcome=record.outcome,
            error=record.error,
            details={**stored_details, **record.trace_details()},
            event_ids=[*stored_ids, *(r.event_id for r in turn.rows if r.event_id not in stored_ids)],
        )
        if finished:
            values["finished_at"] = now
            values["duration_ms"] = round((now - started_at).total_seconds() * 1000)
        return values

    def _run_saved(self, turn: _Turn, record: RunRecord, values: dict[str, Any], *, finished: bool) -> None:
        assert turn.run_row is not None
        turn.run_row = (values["event_ids"], values["details"], turn.run_row[2])
        if finished and self.on_run_finished is not None:
            self.on_run_finished(record.outcome, values["duration_ms"] / 1000, record.provider)

    # --- mid-run input: steer and /stop ---------------------------------------------

    async def _pending_after(self, turn: _Turn) -> list[InboxRow]:
        handled = turn.handled_ids
        return [r for r in await self.inbox.next_rows(turn.lease.key, limit=50) if r.id not in handled]

    @staticmethod
    def _stop_in(rows: Sequence[InboxRow]) -> StopRequest | None:
        for row in rows:
            if command_of(row.event) == "/stop":
                return StopRequest(row_id=row.id, event_id=row.event_id, sender_id=row.event.sender_id)
        return None

    async def _at_boundary(self, turn: _Turn) -> StopRequest | None:
        """Between tool-call groups: a `/stop` ends the run; `steer` injects new messages."""
        signal = self._input_signals.get(turn.lease.key)
        arrived = signal is not None and signal.is_set()
        if signal is not None:
            signal.clear()
        # The last tool result's statement read them, unless an event arrived here since.
        pending, turn.pending = turn.pending, None
        if pending is None or arrived:
            pending = await self._pending_after(turn)
        if not pending:
            return None
        stop = self._stop_in(pending)
        if stop is not None:
            return stop
        channel = turn.reply_to.channel
        settings = self.channel_settings.get(channel)
        if settings is None or settings.busy_policy is not BusyPolicy.STEER:
            return None
        steer: list[InboxRow] = []
        for row in pending:  # only the oldest run of plain messages: order is kept
            if row.channel != channel or is_command(row.event) or row.attempts >= self.max_attempts:
                break
            steer.append(row)
        if steer:
            await self._inject(turn, steer)
        return None

    async def _inject(self, turn: _Turn, rows: list[InboxRow]) -> None:
        lease, session = turn.lease, turn.session
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [r.id for r in rows], "processing", bump_attempts=True, run_id=turn.run_id)
            new_user = [
                user_message(r.event)
                for r in rows
                if r.attempts == 0 or not await self.store.has_event(conn, session.id, r.event_id)
            ]
            seqs = await self.store.append(conn, session.id, new_user, run_id=turn.run_id)
        self._stored(turn, new_user, seqs)
        turn.rows.extend(rows)
        log.info("steered", event_ids=[r.event_id for r in rows])
        await self._publish(lease.key, session.id, new_user, seqs, run_id=turn.run_id)

    async def _wait_stop(self, turn: _Turn) -> StopRequest:
        """Completes when a `/stop` for the key is pending (woken locally, polled across replicas)."""
        signal = self._input_signals.setdefault(turn.lease.key, asyncio.Event())
        while True:
            # Not `asyncio.wait_for`: on Python 3.11 it can swallow the cancellation the
            # run loop sends when the model call finished at the moment the signal fired,
            # and this watcher would then never end.
            woken = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait({woken}, timeout=self.stop_poll)
            finally:
                woken.cancel()
            signal.clear()
            # The run loop cancels this watcher when the model answers, maybe mid-read:
            # shielded, the read finishes and returns its pooled connection regardless.
            read = asyncio.ensure_future(self._pending_after(turn))
            stop = self._stop_in(await asyncio.shield(read))
            if stop is not None:
                return stop

    # --- approvals (the rules and the stored requests: app.pipeline.approvals) ------

    async def _pause(self, turn: _Turn, call: dict[str, Any], record: RunRecord) -> None:
        lease, session = turn.lease, turn.session
        name, arguments = call_name_and_arguments(call)
        now = utcnow()
        expires = now + timedelta(seconds=self.approval_timeout)
        record.outcome = "awaiting_approval"
        async with self._fenced(lease) as conn:
            approval_id = await insert_request(
                conn,
                session_id=session.id,
                key=lease.key,
                run_id=turn.run_id,
                call_id=call["id"],
                name=name,
                arguments=arguments,
                requested_at=now,
                expires_at=expires,
            )
            question = question_text(name, arguments, approval_id, self.approval_timeout)
            await self._insert_reply(
                conn,
                reply_for(turn.reply_to, question),
                session_id=session.id,
                run_id=turn.run_id,
                event_id=turn.reply_to.event_id,
            )
            link = turn.run_id if turn.link_rows else None
            await Inbox.mark(conn, [r.id for r in turn.rows], "done", run_id=link)
            await self._save_run(conn, turn, record, finished=False)
        self.inbox.wake([r.event_id for r in turn.rows])
        self.on_outbox()
        log.info("approval_requested", approval_id=approval_id, tool=name)
        if self.bus is not None:
            await self.bus.publish(
                lease.key,
                {
                    "type": "approval_request",
                    "session_key": lease.key,
                    "run_id": turn.run_id,
                    "approval_id": approval_id,
                    "tool": name,
                    "arguments": arguments,
                    "tool_call_id": call["id"],
                    "expires_at": expires.isoformat(),
                    "text": question,
                },
            )

    async def _decide(self, lease: SessionLease, row: InboxRow, command: str) -> Decided | None:
        """Check and store a decision; None when only a reply was due (refusal, unknown id)."""
        event = row.event
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [row.id], "processing", bump_attempts=True)
            outcome = await decide(
                conn, self.store, self.approval_rules, lease, event, command, conversation_channel(event)
            )
            if isinstance(outcome, Decided):
                return outcome
            if outcome.reply is None:
                await Inbox.mark(conn, [row.id], "done")
            else:
                await self._reply_only(conn, row, outcome.reply, session_id=outcome.session_id)
            return None

    async def _decision_command(self, lease: SessionLease, row: InboxRow, command: str) -> None:
        decided = await self._decide(lease, row, command)
        if decided is None:
            await self._after_reply(row)
            return
        approval, run, session = decided.approval, decided.run, decided.session
        by, status = decided.decision.by, decided.status
        log.info("approval_decided", approval_id=approval["id"], status=status, decided_by=by)
        if self.bus is not None:
            await self.bus.publish(
                lease.key,
                {
                    "type": "approval_decided",
                    "session_key": lease.key,
                    "approval_id": approval["id"],
                    "run_id": run["id"],
                    "status": status,
                    "decided_by": by,
                },
            )
        event = row.event
        calls = open_calls(await self.store.tail(session.id, 64))
        details = dict(run["details"] or {})
        record = RunRecord(
            provider=run["provider"],
            model=run["model"],
            iterations=run["iterations"],
            prompt_tokens=run["prompt_tokens"],
            completion_tokens=run["completion_tokens"],
            tool_calls=list(run["tool_calls"] or []),
            model_ms=int(details.pop("model_ms", 0)),
            tool_ms=int(details.pop("tool_ms", 0)),
            details=details,
        )
        turn = _Turn(
            lease=lease,
            session=session,
            rows=[row],
            run_id=run["id"],
            origin=decided.origin,
            reply_to=event,
            link_rows=False,
        )
        decisions = {approval["tool_call_id"]: decided.decision}
        self._input_signals.setdefault(lease.key, asyncio.Event())
        try:
            record = await self.runner.resume(
                self._hooks(turn),
                self._tool_context(turn),
                record,
                calls=calls,
                decisions=decisions,
                model=None,
            )
        finally:
            self._input_signals.pop(lease.key, None)
        if record.outcome != "awaiting_approval":
            await self._after_turn(lease, turn.session)

    async def enqueue_expired_approvals(self, now: Any = None) -> int:
        """Turn each timed-out approval into a `/deny` event on its session (once, any replica)."""
        async with self.engine.connect() as conn:
            events = await timeout_events(conn, now or utcnow())
        if not events:
            return 0
        results = await self.inbox.accept(events)
        return sum(1 for r in results if not r.duplicate)

    # --- commands -----------------------------------------------------------------

    async def _stop_command(self, lease: SessionLease, row: InboxRow) -> None:
        """`/stop` with no running turn: cancel a run waiting for approval, if any."""
        event = row.event
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [row.id], "processing", bump_attempts=True)
            session = await self.store.open_current(
                conn, lease.key, conversation_channel(event), fence=lease.fence
            )
            waiting = (
                await conn.execute(
                    select(approvals.c.run_id).where(
                        approvals.c.session_id == session.id, approvals.c.status == "pending"
                    )
                )
            ).first()
            if waiting is None:
                await self._reply_only(conn, row, "Nothing is running.", session_id=session.id)
            else:
                closing = await self._close_open_group(
                    conn, session, reason=f"stopped by {event.sender_id}", by=event.sender_id
                )
                final = ChatMessage(role="assistant", content=STOPPED_TEXT)
                await self.store.append(conn, session.id, [*closing, final], run_id=waiting.run_id)
                await self._insert_reply(
                    conn,
                    reply_for(event, STOPPED_TEXT),
                    session_id=session.id,
                    run_id=waiting.run_id,
                    event_id=event.event_id,
                )
                await Inbox.mark(conn, [row.id], "done")
        await self._after_reply(row)

    async def _reply_only(
        self, conn: AsyncConnection, row: InboxRow, text: str, *, session_id: int | None
    ) -> None:
        await self._insert_reply(
            conn,
            reply_for(row.event, text),
            session_id=session_id,
            run_id=None,
            event_id=row.event_id,
        )
        await Inbox.mark(conn, [row.id], "done")

    async def _after_reply(self, row: InboxRow) -> None:
        self.inbox.wake([row.event_id])
        self.on_outbox()

    async def _amend_run(
        self,
        conn: AsyncConnection,
        run_id: int,
        *,
        outcome: str | None = None,
        add_calls: Sequence[dict[str, Any]] = (),
        finished: bool = False,
    ) -> None:
        row = (await conn.execute(select(runs.c.tool_calls).where(runs.c.id == run_id))).first()
        if row is None:
            return
        values: dict[str, Any] = {"tool_calls": [*(row.tool_calls or []), *add_calls]}
        if outcome is not None:
            values["outcome"] = outcome
        if finished:
            values["finished_at"] = utcnow()
        await conn.execute(update(runs).where(runs.c.id == run_id).values(**values))

    async def _session_command(self, lease: SessionLease, row: InboxRow, command: str) -> None:
        event = row.event
        async with self._fenced(lease) as conn:
            current = await self.store._current(conn, lease.key)
            if current is not None:
                # A run waiting for approval cannot continue in a closed session.
                await cancel_pending(conn, current.id, command)
            closed = await self.store.close_current(conn, lease.key)
            await Inbox.mark(conn, [row.id], "done", bump_attempts=True)
            if not event.metadata.get("silent"):
                await self._insert_reply(
                    conn,
                    reply_for(event, SESSION_COMMANDS[command]),
                    session_id=closed.id if closed else None,
                    run_id=None,
                    event_id=event.event_id,
                )
        log.info("session_closed", command=command, session_id=closed.id if closed else None)
        self.inbox.wake([event.event_id])
        self.on_outbox()

    async def _fail(self, lease: SessionLease, rows: Sequence[InboxRow]) -> None:
        """Give up on events that failed too often; tell the user instead of dropping them."""
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [r.id for r in rows], "failed", error="too many failed attempts")
            for row in rows:
                await self._insert_reply(
                    conn,
                    reply_for(row.event, "Sorry, I could not process your message."),
                    session_id=None,
                    run_id=None,
                    event_id=row.event_id,
                )
        log.error("events_failed", event_ids=[r.event_id for r in rows])
        self.inbox.wake([r.event_id for r in rows])
        self.on_outbox()

    def _after_turn_due(self, session: SessionState) -> bool:
        """Whether some after-turn hook may have work (under the lease) for `session`.

        A hook says so with a `due(session)` method; one without it always may.
        """
        for hook in self.after_turn:
            due: Callable[[SessionState], bool] | None = getattr(hook, "due", None)
            if due is None or due(session):
                return True
        return False

    async def _after_turn(self, lease: SessionLease, session: SessionState) -> None:
        for hook in self.after_turn:
            try:
                await hook(lease, session)
            except LeaseLost:
                raise
            except Exception:
                log.exception("after_turn_failed", hook=getattr(hook, "__name__", repr(hook)))

    async def _publish(
        self,
        key: str,
        session_id: int,
        new: Sequence[ChatMessage],
        seqs: Sequence[int],
        *,
        run_id: int | None = None,
        remote: bool = True,
    ) -> None:
        """Tell watchers (browser gateway) about committed messages, after the commit.

        `remote=False`: the statement that wrote them saw no replica watch the key.
        """
        if self.bus is None:
            return
        for msg, seq in zip(new, seqs, strict=True):
            await self.bus.publish(
                key,
                {
                    "type": "message",
                    "session_key": key,
                    "session_id": session_id,
                    "seq": seq,
                    "role": msg.role,
                    "content": msg.content,
                    "tool_calls": list(msg.tool_calls) if msg.tool_calls else None,
                    "tool_call_id": msg.tool_call_id,
                    "name": msg.name,
                    "event_id": msg.event_id,
                    "run_id": run_id,
                },
                remote=remote,
            )

    async def _message_count(self, session_id: int) -> int:
        async with self.engine.connect() as conn:
            return int(
                (
                    await conn.execute(
                        select(func.count()).select_from(messages).where(messages.c.session_id == session_id)
                    )
                ).scalar_one()
            )
