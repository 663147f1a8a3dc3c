"""The commands every gateway has: the session's own (/new /reset /end /help) and the run's
(/stop /approve /deny). Each is one registry entry (`BuiltinCommands.commands`) and a handler."""

from __future__ import annotations

import structlog

from app.agent.loop import STOPPED_TEXT
from app.agent.send_file import stored_attachments, without_bytes
from app.pipeline.approvals import Decided, NoDecision
from app.pipeline.commands import Command, CommandCall, CommandHandler, CommandRegistry
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import Answer, PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn import TurnRunner
from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)


class BuiltinCommands:
    def __init__(
        self, store: PipelineStore, replies: Replies, turns: TurnRunner, registry: CommandRegistry
    ) -> None:
        self.store = store
        self.replies = replies
        self.turns = turns
        self.registry = registry  # what /help lists: every family's commands, these among them

    def commands(self) -> list[Command]:
        return [
            Command("/help", {"en": "List the commands.", "zh": "列出可用命令。"}, self.help),
            Command(
                "/new",
                {
                    "en": "Start a new conversation (the old one is kept).",
                    "zh": "开始新的对话（旧对话会保留）。",
                },
                self._closing("new.done"),
            ),
            Command(
                "/reset",
                {
                    "en": "Reset the conversation (history kept, no longer used).",
                    "zh": "重置对话（历史保留但不再使用）。",
                },
                self._closing("reset.done"),
            ),
            Command(
                "/end", {"en": "End the conversation.", "zh": "结束当前对话。"}, self._closing("end.done")
            ),
            Command(
                "/stop",
                {"en": "Stop what the bot is doing now.", "zh": "停止当前正在进行的任务。"},
                self.stop,
                in_turn=True,
            ),
            Command(
                "/approve",
                {"en": "Allow a tool call that asked for approval.", "zh": "批准一个等待审批的工具调用。"},
                self.decision,
                usage="<id>",
            ),
            Command(
                "/deny",
                {"en": "Refuse a tool call that asked for approval.", "zh": "拒绝一个等待审批的工具调用。"},
                self.decision,
                usage="<id>",
            ),
        ]

    # --- /help ------------------------------------------------------------------------

    async def help(self, call: CommandCall) -> None:
        await self.replies.answer(call.lease, call.row, self.registry.help_text(call.locale))

    # --- /new /reset /end -------------------------------------------------------------

    def _closing(self, done_text: str) -> CommandHandler:
        async def close(call: CommandCall) -> None:
            await self._close_session(call, done_text)

        return close

    async def _close_session(self, call: CommandCall, done_text: str) -> None:
        """Expire the key's open session; the next event opens a new generation. History stays."""
        event = call.event
        silent = bool(event.metadata.get("silent"))
        text = None if silent else say(done_text, call.locale)
        closed = await self.store.close_session(
            call.lease, by=call.name, answer=self.replies.answer_of(call.row, text)
        )
        log.info("session_closed", command=call.name, session_id=closed.id if closed else None)
        self.replies.handled([event.event_id], outbox=not silent)

    # --- /stop with no running turn -------------------------------------------------

    async def stop(self, call: CommandCall) -> None:
        """Cancel a run waiting for approval, if any (a running turn handles `/stop` itself)."""
        event, lease = call.event, call.lease
        session, paused = await self.store.paused_run(lease, conversation_channel(event))
        if paused is None:
            await self.replies.answer(
                lease, call.row, say("stop.nothing", call.locale), session_id=session.id
            )
            return
        # What the run attached before its pause goes with the answer (`send_file`).
        media = await stored_attachments(
            dict(paused.details),
            self.turns.runner.tools,
            session_id=session.id,
            session_key=lease.key,
            generation=session.generation,
        )
        final = ChatMessage(
            role="assistant", content=STOPPED_TEXT, parts=without_bytes(media) if media else None
        )
        answer = self.replies.answer_of(
            call.row, STOPPED_TEXT, session_id=session.id, run_id=paused.run_id, media=media or ()
        )
        await self.store.stop_paused_run(lease, paused, by=event.sender_id, final=final, answer=answer)
        self.replies.handled([event.event_id])

    # --- /approve /deny ---------------------------------------------------------------

    async def decision(self, call: CommandCall) -> None:
        """Check and store the decision; the run that asked continues in this turn."""
        decided = await self._decide(call)
        if decided is None:
            return
        approval, run = decided.approval, decided.run
        by, status = decided.decision.by, decided.status
        log.info("approval_decided", approval_id=approval["id"], status=status, decided_by=by)
        await self.turns.feed.event(
            call.lease.key,
            "approval_decided",
            approval_id=approval["id"],
            run_id=run["id"],
            status=status,
            decided_by=by,
        )
        await self.turns.resume(call.lease, call.row, decided)

    async def _decide(self, call: CommandCall) -> Decided | None:
        """Store a decision; None when only a reply was due (a refusal, an unknown id)."""
        event = call.event

        def answer(outcome: NoDecision) -> Answer:
            return self.replies.answer_of(
                call.row, outcome.reply, session_id=outcome.session_id, private=outcome.refused
            )

        outcome = await self.store.decide_approval(
            call.lease,
            event,
            call.name,
            conversation_channel(event),
            self.turns.tools.approval_rules,
            answer,
        )
        if isinstance(outcome, Decided):
            return outcome
        self.replies.handled([event.event_id], outbox=outcome.reply is not None)
        return None
