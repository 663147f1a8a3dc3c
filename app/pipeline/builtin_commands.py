"""The commands every gateway has: the session's own (/new /reset /end /help) and the run's
(/stop /approve /deny). Each is one registry entry (`BuiltinCommands.commands`) and a handler."""

from __future__ import annotations

import structlog
from sqlalchemy import select

from app.agent.loop import STOPPED_TEXT
from app.agent.send_file import stored_attachments, without_bytes
from app.db.models import approvals, runs, utcnow
from app.pipeline.approvals import Decided, cancel_pending, decide
from app.pipeline.commands import Command, CommandCall, CommandHandler, CommandRegistry
from app.pipeline.replies import Replies, conversation_channel, reply_for
from app.pipeline.storage.history import close_open_group
from app.pipeline.storage.inbox_queries import MARK
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn import TurnRunner
from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)


class BuiltinCommands:
    def __init__(self, store: PipelineStore, replies: Replies, turns: TurnRunner) -> None:
        self.store = store
        self.replies = replies
        self.turns = turns
        self.registry: CommandRegistry | None = None  # for /help: set by `commands`

    def commands(self, registry: CommandRegistry) -> list[Command]:
        self.registry = registry
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
        assert self.registry is not None
        await self._answer(call, self.registry.help_text(call.locale))

    async def _answer(self, call: CommandCall, text: str, *, session_id: int | None = None) -> None:
        async with self.store.fenced(call.lease) as conn:
            await self.replies.answer(conn, call.row, text, session_id=session_id)
        self.replies.handled([call.row.event_id])

    # --- /new /reset /end -------------------------------------------------------------

    def _closing(self, done_text: str) -> CommandHandler:
        async def close(call: CommandCall) -> None:
            await self._close_session(call, done_text)

        return close

    async def _close_session(self, call: CommandCall, done_text: str) -> None:
        """Expire the key's open session; the next event opens a new generation. History stays."""
        event, lease, sessions = call.event, call.lease, self.store.sessions
        async with self.store.fenced(lease) as conn:
            current = await sessions._current(conn, lease.key)
            if current is not None:
                # A run waiting for approval cannot continue in a closed session.
                await cancel_pending(conn, current.id, call.name)
            closed = await sessions.close_current(conn, lease.key)
            if event.metadata.get("silent"):
                await conn.execute(MARK, {"ids": [call.row.id], "status": "done", "updated_at": utcnow()})
            else:
                text = say(done_text, call.locale)
                await self.replies.answer(conn, call.row, text, session_id=closed.id if closed else None)
        log.info("session_closed", command=call.name, session_id=closed.id if closed else None)
        self.replies.handled([event.event_id], outbox=not event.metadata.get("silent"))

    # --- /stop with no running turn -------------------------------------------------

    async def stop(self, call: CommandCall) -> None:
        """Cancel a run waiting for approval, if any (a running turn handles `/stop` itself)."""
        event, lease, sessions = call.event, call.lease, self.store.sessions
        async with self.store.fenced(lease) as conn:
            session = await sessions.open_current(
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
                await self.replies.answer(
                    conn, call.row, say("stop.nothing", call.locale), session_id=session.id
                )
            else:
                closing = await close_open_group(
                    conn, sessions, session, reason=f"stopped by {event.sender_id}", by=event.sender_id
                )
                # What the run attached before its pause goes with the answer (`send_file`).
                details = (
                    await conn.execute(select(runs.c.details).where(runs.c.id == waiting.run_id))
                ).scalar_one_or_none() or {}
                media = await stored_attachments(
                    details,
                    self.turns.runner.tools,
                    session_id=session.id,
                    session_key=lease.key,
                    generation=session.generation,
                )
                final = ChatMessage(
                    role="assistant", content=STOPPED_TEXT, parts=without_bytes(media) if media else None
                )
                await sessions.append(conn, session.id, [*closing, final], run_id=waiting.run_id)
                await self.replies.insert(
                    conn,
                    reply_for(event, STOPPED_TEXT, media or ()),
                    session_id=session.id,
                    run_id=waiting.run_id,
                    event_id=event.event_id,
                )
                await conn.execute(MARK, {"ids": [call.row.id], "status": "done", "updated_at": utcnow()})
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
        event, lease = call.event, call.lease
        async with self.store.fenced(lease) as conn:
            outcome = await decide(
                conn,
                self.store.sessions,
                self.turns.tools.approval_rules,
                lease,
                event,
                call.name,
                conversation_channel(event),
            )
            if isinstance(outcome, Decided):
                return outcome
            if outcome.reply is None:
                await conn.execute(MARK, {"ids": [call.row.id], "status": "done", "updated_at": utcnow()})
            else:
                await self.replies.answer(conn, call.row, outcome.reply, session_id=outcome.session_id)
        self.replies.handled([event.event_id], outbox=outcome.reply is not None)
        return None
