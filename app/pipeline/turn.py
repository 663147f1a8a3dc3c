"""An agent turn of one session: start, the run with its writes, the answer and its reply.

Every write goes through the store under the key's lease (`app.pipeline.storage`). The
final answer, its outbox row, the run trace and the inbox rows' status commit together,
so a crash either leaves the turn to be resumed or finished. Watchers (the browser
gateway) learn about each commit on the session bus, after the commit.

A run that asks for approval of a risky tool call pauses (`app.pipeline.turn_pause`: the
question is its turn's answer); `/approve` or `/deny` continues it later through `resume`. Which model and
which part of the history the run sees is `app.pipeline.turn_window`'s; what its tools may
do, `app.pipeline.turn_tools`'.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import structlog

from app.agent.loop import AgentRunner, Decision, RunHooks, RunRecord, StopRequest, open_calls
from app.agent.send_file import without_bytes
from app.agent.tools import ToolContext
from app.channel import ChannelSettings, WaitResult
from app.db.models import utcnow
from app.events import InboundEvent
from app.memory.recall import MemoryRecall
from app.pipeline.after_turn import AfterTurnHooks
from app.pipeline.approvals import (
    Decided,
)
from app.pipeline.feed import SessionFeed
from app.pipeline.inbox_files import InboxFiles
from app.pipeline.midrun import MidRun
from app.pipeline.replies import Replies, conversation_channel, reply_for
from app.pipeline.run_trace import record_of, run_trace, run_values
from app.pipeline.storage.inbox_queries import COUNT_ATTEMPT, reply_of
from app.pipeline.storage.port import InboxRow, PipelineStore, Recall, TurnEnd, TurnPlan
from app.pipeline.turn_fit import ContextFit
from app.pipeline.turn_pause import Pause
from app.pipeline.turn_state import Handled, HandOn, TurnState, WindowLimits
from app.pipeline.turn_tools import TurnTools
from app.pipeline.turn_window import TurnWindow
from app.sessions.hooks import AfterTurn
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.tokens import ContextLimits

log = structlog.get_logger(__name__)


class TurnRunner:
    def __init__(
        self,
        store: PipelineStore,
        runner: AgentRunner,
        replies: Replies,
        midrun: MidRun,
        *,
        limits: WindowLimits,
        models: Mapping[str, str | None] | None = None,
        feed: SessionFeed | None = None,
        after_turn: Sequence[AfterTurn] = (),
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        tools_allow: Sequence[str] = (),
        tools_deny: Sequence[str] = (),
        approval_timeout: float = 300.0,
        on_run_finished: Callable[[str, float, str], None] | None = None,
        recall: MemoryRecall | None = None,
        context: ContextLimits | None = None,
    ) -> None:
        self.store = store
        self.runner = runner
        self.replies = replies
        self.midrun = midrun
        self.window = TurnWindow(store, limits, models)
        self.models = self.window.models  # each channel's model (read by /model)
        self.feed = feed or SessionFeed(None)
        self.after_turn = AfterTurnHooks(after_turn)
        self.channel_settings = dict(channel_settings or {})
        self.fit = ContextFit(store, self.window, context or ContextLimits(), self.channel_settings)
        self.tools = TurnTools(self.channel_settings, tools_allow=tools_allow, tools_deny=tools_deny)
        self.approval_timeout = approval_timeout
        self.on_run_finished = on_run_finished
        self.recall = recall  # read with a turn's start where the store can
        # Set by the runtime: where received files are kept (per-session workspaces).
        self.inbox_files = InboxFiles(None)
        # Set by the runtime: add a turn's model tokens to the quota counters (app.access).
        self.count_tokens: Callable[[InboundEvent, int], Awaitable[None]] | None = None

    # --- a new turn -----------------------------------------------------------------

    async def run(self, lease: SessionLease, rows: list[InboxRow], hand_on: HandOn | None) -> Handled:
        """Answer `rows` (their attempt counted) with one agent run."""
        events = [r.event for r in rows]
        last = events[-1]
        answer = not all(e.metadata.get("no_reply") for e in events)
        now = utcnow()
        run, run_row = run_values(
            lease.key, events, now, provider=self.runner.provider.name, model=self.models.get(last.channel)
        )
        channel = conversation_channel(last)
        recall = None
        if self.recall is not None:
            with_user, params = self.recall.recall_params(
                last.channel, last.chat_type.value, lease.key, last.sender_id
            )
            recall = Recall(with_user, params)
        plan = TurnPlan(
            rows=rows,
            channel=channel,
            expire_after=self.store.sessions.lifecycle(channel).expire_after,
            user_messages=[self.inbox_files.message(e) for e in events],
            run=run if answer else None,
            now=now,
            window_limit=self.window.limits.max_messages,
            recall=recall,
        )
        started = await self.store.start(lease, plan)
        await self.inbox_files.save(events, lease.key, started.session.generation)
        await self.feed.messages(
            lease.key, started.session.id, started.added, started.seqs, remote=started.watched
        )
        if started.run_id is None:
            self.replies.handled([e.event_id for e in events], outbox=False)
            return Handled()
        turn = TurnState(
            lease=lease,
            session=started.session,
            rows=list(rows),
            run_id=started.run_id,
            origin=last,
            reply_to=last,
            run_row=run_row,
            stored=started.window,
            recalled=started.recalled,
            watched=started.watched,
            hand_on=hand_on,
        )
        # A model chosen with /model is stored on the session (app.agents.session_commands).
        turn.model = model = self.window.model(started.session, last)
        record = RunRecord(provider=self.runner.provider.name, model=model)
        with self.midrun.running(lease.key):
            async with self.window.beat(started.session.id):
                record = await self.runner.resume(
                    self._hooks(turn),
                    self._tool_context(turn),
                    record,
                    calls=(),
                    decisions={},
                    model=record.model,
                )
        await self._count_tokens(last, record, already=0)
        # A released lease means no after-turn hook was due (`_finish`).
        if record.outcome != "awaiting_approval" and not turn.released:
            await self.after_turn.run(lease, turn.session)
        return Handled(turn.upcoming, turn.released)

    # --- a paused run continued (/approve, /deny, the timeout) ----------------------

    async def resume(self, lease: SessionLease, row: InboxRow, decided: Decided) -> None:
        approval, run, session = decided.approval, decided.run, decided.session
        record = record_of(run)
        turn = TurnState(
            lease=lease,
            session=session,
            rows=[row],
            run_id=run["id"],
            origin=decided.origin,
            reply_to=row.event,
            run_row=None,
            link_rows=False,
        )
        turn.model = self.window.model(session, decided.origin)
        calls = open_calls(await self.store.sessions.tail(session.id, 64))
        decisions = {approval["tool_call_id"]: decided.decision}
        with self.midrun.running(lease.key):
            record = await self.runner.resume(
                self._hooks(turn),
                self._tool_context(turn),
                record,
                calls=calls,
                decisions=decisions,
                model=turn.model,
            )
        await self._count_tokens(
            decided.origin, record, already=run["prompt_tokens"] + run["completion_tokens"]
        )
        if record.outcome != "awaiting_approval":
            await self.after_turn.run(lease, turn.session)

    async def _count_tokens(self, origin: InboundEvent, record: RunRecord, *, already: int) -> None:
        """The run's tokens since `already` (counted before a pause), recorded with its usage."""
        tokens = record.prompt_tokens + record.completion_tokens - already
        if self.count_tokens is None or tokens <= 0:
            return
        try:
            await self.count_tokens(origin, tokens)
        except Exception:  # the turn is done; a missed count must not make it fail
            log.exception("token_count_failed", session_key=origin.session_key)

    # --- the hooks the run loop calls -----------------------------------------------

    def _tool_context(self, turn: TurnState) -> ToolContext:
        return self.tools.context(turn, lambda: self.store.sessions.message_count(turn.session.id))

    def _hooks(self, turn: TurnState) -> RunHooks:
        lease = turn.lease

        async def append(new: list[ChatMessage]) -> None:
            # A tool result may be its group's last: the boundary after it looks at the
            # key's other rows, which the store may read with the append.
            handled = sorted(turn.handled_ids) if new and new[-1].role == "tool" else None
            appended = await self.store.append(
                lease, turn.session.id, new, run_id=turn.run_id, handled=handled
            )
            turn.watched, turn.pending = appended.watched, appended.pending
            await self._appended(turn, new, appended.seqs)

        async def finish(final: ChatMessage, record: RunRecord) -> None:
            await self._finish(turn, final, record, reply_to=turn.reply_to, extra=())

        async def stopped(final: ChatMessage, record: RunRecord, stop: StopRequest) -> None:
            stop_rows = [
                r for r in await self.midrun.pending(lease.key, turn.handled_ids) if r.id == stop.row_id
            ]
            reply_to = stop_rows[0].event if stop_rows else turn.reply_to
            await self._finish(turn, final, record, reply_to=reply_to, extra=stop_rows)

        async def on_delta(text: str) -> None:
            await self.feed.delta(lease.key, turn.run_id, text, remote=turn.watched)

        async def at_boundary() -> StopRequest | None:
            known, turn.pending = turn.pending, None
            found = await self.midrun.at_boundary(lease.key, turn.reply_to.channel, turn.handled_ids, known)
            if found.inject:
                await self._inject(turn, list(found.inject))
            return found.stop

        async def wait_stop() -> StopRequest:
            return await self.midrun.wait_stop(lease.key, turn.handled_ids)

        async def gate(call: dict[str, Any], ctx: ToolContext) -> Decision:
            return self.tools.gate(turn)

        async def pause(call: dict[str, Any], record: RunRecord) -> None:
            await self._pause(turn, call, record)

        return RunHooks(
            load_window=partial(self.window.load, turn),
            append=append,
            finish=finish,
            on_delta=on_delta if self.feed.streams else None,
            at_boundary=at_boundary,
            wait_stop=wait_stop,
            stopped=stopped,
            gate=gate,
            pause=pause,
            fit=partial(self.fit, turn),  # the request within the model's context
        )

    async def _appended(self, turn: TurnState, new: Sequence[ChatMessage], seqs: Sequence[int]) -> None:
        """Keep `turn.stored` as a read would return it, and tell the watchers."""
        self.window.keep(turn, new, seqs)
        await self.feed.messages(
            turn.lease.key, turn.session.id, new, seqs, run_id=turn.run_id, remote=turn.watched
        )

    async def _inject(self, turn: TurnState, rows: list[InboxRow]) -> None:
        """Steered messages join the run after its complete tool-result group."""
        lease, session = turn.lease, turn.session
        async with self.store.fenced(lease) as conn:
            mark = {"ids": [r.id for r in rows], "status": "processing", "run_id": turn.run_id}
            await conn.execute(COUNT_ATTEMPT, {**mark, "updated_at": utcnow()})
            new_user = [
                self.inbox_files.message(r.event)
                for r in rows
                if r.attempts == 0 or not await self.store.sessions.has_event(conn, session.id, r.event_id)
            ]
            seqs = await self.store.sessions.append(conn, session.id, new_user, run_id=turn.run_id)
        await self.inbox_files.save([r.event for r in rows], lease.key, session.generation)
        turn.rows.extend(rows)
        log.info("steered", event_ids=[r.event_id for r in rows])
        await self._appended(turn, new_user, seqs)

    # --- the end of a turn ----------------------------------------------------------

    async def _finish(
        self,
        turn: TurnState,
        final: ChatMessage,
        record: RunRecord,
        *,
        reply_to: InboundEvent,
        extra: Sequence[InboxRow],
    ) -> None:
        lease, session = turn.lease, turn.session
        rows = [*turn.rows, *extra]
        # The outbox row carries the attachments' bytes; the history keeps references.
        media, final = final.parts, replace(final, parts=without_bytes(final.parts) if final.parts else None)
        reply = self.replies.row(
            reply_for(reply_to, final.content or "", media or ()),
            session_id=session.id,
            run_id=turn.run_id,
            event_id=reply_to.event_id,
        )
        now = reply["created_at"]
        if turn.run_row is None:  # a resumed run: its row was not read by this turn
            turn.run_row = await self.store.run_row(turn.run_id)
        trace = run_trace(turn.run_row, record, [r.event_id for r in rows], finished=True, now=now)
        # The answer will be the session's newest message (seq `next_seq`).
        after = replace(session, next_seq=session.next_seq + 1)
        hand_on, turn.hand_on = turn.hand_on, None
        release = hand_on is not None and not self.after_turn.due(after)
        picked = hand_on.pick() if release and hand_on is not None else None
        end = TurnEnd(
            session_id=session.id,
            answer=final,
            run_id=turn.run_id,
            reply=reply,
            inbox_ids=[r.id for r in rows],
            link=turn.run_id if turn.link_rows else None,
            trace=trace,
            now=now,
            release=release,
            successor=picked,
        )
        try:
            finished = await self.store.finish(lease, end)
        except BaseException:
            if picked is not None:
                assert hand_on is not None
                hand_on.put_back(picked)
            raise
        if picked is not None:
            assert hand_on is not None
            if finished.released:
                hand_on.hand(picked, finished.successor)
            else:
                hand_on.put_back(picked)
        self._run_saved(turn, record, trace, finished=True)
        turn.watched, turn.upcoming, turn.released = finished.watched, finished.upcoming, finished.released
        # The answer is the session's newest message: the after-turn hooks count from it.
        turn.session = replace(session, next_seq=finished.seq + 1)
        known = None
        if turn.link_rows and not extra:
            # Exactly what the waiter's read would return now: no second look needed.
            known = WaitResult(
                done=True, replies=[reply_of(reply["message_id"], reply["payload"], reply["status"])]
            )
        self.replies.handled([r.event_id for r in rows], result=known, outbox=reply["status"] == "pending")
        if known is not None:
            await asyncio.sleep(0)  # the woken waiters answer before the after-turn work
        await self.feed.messages(
            lease.key, session.id, [final], [finished.seq], run_id=turn.run_id, remote=turn.watched
        )

    def _run_saved(
        self, turn: TurnState, record: RunRecord, values: dict[str, Any], *, finished: bool
    ) -> None:
        assert turn.run_row is not None
        turn.run_row = (values["event_ids"], values["details"], turn.run_row[2])
        if finished and self.on_run_finished is not None:
            self.on_run_finished(record.outcome, values["duration_ms"] / 1000, record.provider)

    # --- approvals: a run that asks pauses; its question is the turn's answer ----------

    async def _pause(self, turn: TurnState, call: dict[str, Any], record: RunRecord) -> None:
        if turn.run_row is None:
            turn.run_row = await self.store.run_row(turn.run_id)
        pause = Pause(self.store, self.replies, self.feed, self.approval_timeout)
        await pause(
            turn, call, record, saved=lambda trace: self._run_saved(turn, record, trace, finished=False)
        )
