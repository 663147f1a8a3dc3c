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
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.roles import Roles
from app.agent.loop import AgentRunner, Decision, RunHooks, RunRecord, StopRequest, open_calls
from app.agent.provider import ProviderReply
from app.agent.send_file import without_bytes
from app.agent.tools import ToolContext
from app.channel import ChannelSettings, WaitResult
from app.db.models import utcnow
from app.errors import RowsCanceled
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
from app.pipeline.run_trace import RunRow, record_of, run_trace, run_values
from app.pipeline.storage.inbox_queries import reply_of
from app.pipeline.storage.port import InboxRow, PipelineStore, Recall, TurnEnd, TurnPlan
from app.pipeline.turn_fit import Consolidating, ContextFit
from app.pipeline.turn_pause import Pause
from app.pipeline.turn_state import Handled, HandOn, TurnState, WindowLimits
from app.pipeline.turn_tools import TurnTools
from app.pipeline.turn_window import TurnWindow
from app.sessions.hooks import AfterTurn
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.profiles import SessionModels, SessionProfiles
from app.sessions.tokens import ContextLimits
from app.usage.meter import Payer, UsageMeter

log = structlog.get_logger(__name__)


class TurnRunner:
    def __init__(
        self,
        store: PipelineStore,
        runner: AgentRunner,
        replies: Replies,
        midrun: MidRun,
        *,
        profiles: SessionProfiles,
        models: SessionModels,
        limits: WindowLimits,
        feed: SessionFeed | None = None,
        after_turn: Sequence[AfterTurn] = (),
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        tools_allow: Sequence[str] = (),
        tools_deny: Sequence[str] = (),
        approval_timeout: float = 300.0,
        on_run_finished: Callable[[str, float, str], None] | None = None,
        recall: MemoryRecall | None = None,
        context: ContextLimits | None = None,
        consolidator: Consolidating | None = None,
        inbox_files: InboxFiles | None = None,
        count_tokens: Callable[[InboundEvent, int], Awaitable[None]] | None = None,
        heartbeat_engine: AsyncEngine | None = None,
        heartbeat_seconds: float = 0.0,
        roles: Roles | None = None,
        usage: UsageMeter | None = None,
    ) -> None:
        """`profiles`: what the serving agent says about a session (app.agents; `NoProfiles`
        without agents); `inbox_files`: where received files are kept (per-session
        workspaces); `count_tokens`: add a turn's model tokens to the quota counters
        (app.access); `heartbeat_*`: keep a working run's session active."""
        self.store = store
        self.runner = runner
        self.replies = replies
        self.midrun = midrun
        self.window = TurnWindow(
            store, limits, models, heartbeat_engine=heartbeat_engine, heartbeat_seconds=heartbeat_seconds
        )
        self.feed = feed or SessionFeed(None)
        self.after_turn = AfterTurnHooks(after_turn)
        self.channel_settings = dict(channel_settings or {})
        self.fit = ContextFit(
            store, self.window, context or ContextLimits(), profiles, self.channel_settings, consolidator
        )
        self.tools = TurnTools(
            self.channel_settings, profiles, tools_allow=tools_allow, tools_deny=tools_deny, roles=roles
        )
        self.approval_timeout = approval_timeout
        self.on_run_finished = on_run_finished
        self.recall = recall  # read with a turn's start where the store can
        self.inbox_files = inbox_files or InboxFiles(None)
        self.count_tokens = count_tokens
        self.usage = usage  # every model call's usage, budgets before each (app.usage)

    # --- a new turn -----------------------------------------------------------------

    async def run(
        self, lease: SessionLease, rows: list[InboxRow], hand_on: HandOn | None, *, counted: bool = True
    ) -> Handled:
        """Answer `rows` with one agent run; unless `counted`, the start counts their attempt
        (a row canceled meanwhile is left out)."""
        try:
            plan, run_row = self._plan(lease, rows, count_attempt=not counted)
        except Exception:
            if not counted:  # nothing ran yet, but the attempt counts: no row is tried for ever
                await self.store.count_attempt(lease, [r.id for r in rows])
            raise
        try:
            started = await self.store.start(lease, plan)
        except RowsCanceled as canceled:
            left = [r for r in rows if r.id not in canceled.ids]
            return await self.run(lease, left, hand_on, counted=False) if left else Handled()
        events = [r.event for r in rows]
        last = events[-1]
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
        turn.trust = self.tools.trust([r.event for r in rows], last)
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

    def _plan(
        self, lease: SessionLease, rows: list[InboxRow], *, count_attempt: bool
    ) -> tuple[TurnPlan, RunRow]:
        """The turn's start (`PipelineStore.start`) and its run row's values."""
        events = [r.event for r in rows]
        last = events[-1]
        answer = not all(e.metadata.get("no_reply") for e in events)
        now = utcnow()
        run, run_row = run_values(
            lease.key,
            events,
            now,
            provider=self.runner.provider.name,
            model=self.window.models.channel_models.get(last.channel),
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
            count_attempt=count_attempt,
        )
        return plan, run_row

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
        # The run read what it read before its pause: its guarded calls still need asking.
        turn.trust = self.tools.trust([decided.origin], decided.origin)
        turn.trust.untrusted = True
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

        before_model = after_model = None
        if self.usage is not None:
            usage = self.usage
            settings = self.channel_settings.get(turn.origin.channel)
            payer = Payer(turn.origin, lease.key, getattr(settings, "locale", "en"))

            async def before_model(model: str | None) -> None:
                await usage.check(payer)

            async def after_model(reply: ProviderReply, model: str | None) -> None:
                try:
                    await usage.record(payer, reply, model)
                except Exception:  # the answer is made; a usage row that fails must not undo it
                    log.exception("usage_record_failed", session_key=lease.key)

        return RunHooks(
            before_model=before_model,
            after_model=after_model,
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
        messages = [self.inbox_files.message(r.event) for r in rows]
        injected = await self.store.inject(lease, session.id, rows, messages, run_id=turn.run_id)
        # A row canceled while it waited (A2A tasks/cancel) does not join the run.
        joined = [r for r in rows if r.id in set(injected.row_ids)]
        await self.inbox_files.save([r.event for r in joined], lease.key, session.generation)
        self.tools.join(turn.trust, [r.event for r in joined], turn.origin)  # steered senders count
        turn.rows.extend(joined)
        log.info("steered", event_ids=[r.event_id for r in joined])
        await self._appended(turn, injected.added, injected.seqs)

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
