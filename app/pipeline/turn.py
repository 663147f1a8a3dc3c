"""One turn of one session: commands, user messages, the agent run, the replies.

Every write goes through `_fenced`, which checks the key's lease fence in the same
transaction; the final answer, its outbox rows, the run trace and the inbox status
commit together, so a crash either leaves the turn to be resumed or finished.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass

import structlog
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.loop import AgentRunner, RunHooks, RunRecord, repair_interrupted
from app.agent.tools import ToolContext
from app.bus import SessionBus
from app.db.models import messages, outbox, runs, utcnow
from app.errors import LeaseLost
from app.events import InboundEvent, OutboundMessage, TextPart
from app.pipeline.inbox import Inbox, InboxRow
from app.sessions.lease import SessionLease, check_fence
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore

log = structlog.get_logger(__name__)

SESSION_COMMANDS = {
    "/new": "Started a new conversation.",
    "/reset": "The conversation was reset. Earlier messages are kept but no longer used.",
    "/end": "Conversation ended. Send a message to start a new one.",
}


AfterTurn = Callable[[SessionLease, SessionState], Awaitable[None]]
"""Runs after a turn finished, still under the key's lease (e.g. memory consolidation)."""


@dataclass(frozen=True)
class WindowLimits:
    max_messages: int | None
    max_tokens: int | None


def reply_for(event: InboundEvent, text: str) -> OutboundMessage:
    target = event.metadata.get("reply_target") or {}
    return OutboundMessage(
        channel=target.get("channel", event.channel),
        chat_id=target.get("chat_id", event.chat_id),
        thread_id=target.get("thread_id", event.thread_id),
        parts=(TextPart(text=text),),
        reply_to=event.external_id,
        session_key=event.session_key,
        in_reply_to_event=event.event_id,
        metadata={k: v for k, v in event.metadata.items() if k.startswith("reply_")},
    )


async def insert_outbox(
    conn: AsyncConnection,
    message: OutboundMessage,
    *,
    session_id: int | None,
    run_id: int | None,
    event_id: str | None,
) -> None:
    now = utcnow()
    await conn.execute(
        outbox.insert().values(
            message_id=message.message_id,
            session_key=message.session_key or "",
            session_id=session_id,
            run_id=run_id,
            event_id=event_id,
            channel=message.channel,
            chat_id=message.chat_id,
            payload=message.model_dump(mode="json"),
            status="pending",
            attempts=0,
            next_attempt_at=now,
            created_at=now,
        )
    )


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
        bus: SessionBus | None = None,
        after_turn: Sequence[AfterTurn] = (),
    ) -> None:
        self.engine = engine
        self.store = store
        self.inbox = inbox
        self.runner = runner
        self.limits = limits
        self.max_attempts = max_attempts
        self.models = dict(models or {})
        self.on_outbox = on_outbox or (lambda: None)
        self.bus = bus
        self.after_turn = list(after_turn)

    @asynccontextmanager
    async def _fenced(self, lease: SessionLease) -> AsyncIterator[AsyncConnection]:
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            yield conn

    async def handle(self, lease: SessionLease, rows: Sequence[InboxRow]) -> None:
        """Handle a batch of the key's events as one turn (one event unless `collect`)."""
        live: list[InboxRow] = []
        poisoned: list[InboxRow] = []
        for row in rows:
            (poisoned if row.attempts >= self.max_attempts else live).append(row)
        if poisoned:
            await self._fail(lease, poisoned)
        if not live:
            return
        events = [r.event for r in live]
        last = events[-1]
        command = last.text.strip().split(maxsplit=1)[0].lower() if last.text.strip() else ""
        if len(events) == 1 and command in SESSION_COMMANDS:
            await self._session_command(lease, live[0], command)
            return

        started = time.monotonic()
        async with self._fenced(lease) as conn:
            await Inbox.mark(conn, [r.id for r in live], "processing", bump_attempts=True)
            session = await self.store.open_current(conn, lease.key, last.channel)
            new_user = [
                _user_message(e)
                for e in events
                if not await self.store.has_event(conn, session.id, e.event_id)
            ]
            user_seqs = await self.store.append(conn, session.id, new_user)
            answer = not all(e.metadata.get("no_reply") for e in events)
            run_id = None
            if answer:
                run_id = (
                    await conn.execute(
                        runs.insert()
                        .values(
                            session_id=session.id,
                            session_key=lease.key,
                            event_ids=[e.event_id for e in events],
                            provider=self.runner.provider.name,
                            model=self.models.get(last.channel),
                            tool_calls=[],
                            started_at=utcnow(),
                            outcome="running",
                            details={},
                        )
                        .returning(runs.c.id)
                    )
                ).scalar_one()
            else:
                await Inbox.mark(conn, [r.id for r in live], "done")
        await self._publish(lease.key, session.id, new_user, user_seqs)
        if not answer:
            self.inbox.wake([e.event_id for e in events])
            return

        repairs = repair_interrupted(await self.store.tail(session.id, 64))
        if repairs:
            async with self._fenced(lease) as conn:
                seqs = await self.store.append(conn, session.id, repairs, run_id=run_id)
            await self._publish(lease.key, session.id, repairs, seqs)

        assert run_id is not None
        hooks = self._hooks(lease, session, live, run_id, started)
        tool_ctx = ToolContext(
            session_id=session.id,
            session_key=lease.key,
            channel=last.channel,
            chat_id=last.chat_id,
            sender_id=last.sender_id,
            thread_id=last.thread_id,
            message_count=lambda: self._message_count(session.id),
        )
        await self.runner.run(hooks, tool_ctx, model=self.models.get(last.channel))
        for hook in self.after_turn:
            try:
                await hook(lease, session)
            except LeaseLost:
                raise
            except Exception:
                log.exception("after_turn_failed", hook=getattr(hook, "__name__", repr(hook)))

    def _hooks(
        self,
        lease: SessionLease,
        session: SessionState,
        rows: Sequence[InboxRow],
        run_id: int,
        started: float,
    ) -> RunHooks:
        last = rows[-1].event

        async def load_window() -> list[ChatMessage]:
            return await self.store.load_window(
                session, max_messages=self.limits.max_messages, max_tokens=self.limits.max_tokens
            )

        async def append(new: list[ChatMessage]) -> None:
            async with self._fenced(lease) as conn:
                seqs = await self.store.append(conn, session.id, new, run_id=run_id)
            await self._publish(lease.key, session.id, new, seqs)

        async def finish(final: ChatMessage, record: RunRecord) -> None:
            reply = reply_for(last, final.content or "")
            async with self._fenced(lease) as conn:
                seqs = await self.store.append(conn, session.id, [final], run_id=run_id)
                await insert_outbox(conn, reply, session_id=session.id, run_id=run_id, event_id=last.event_id)
                await Inbox.mark(conn, [r.id for r in rows], "done", run_id=run_id)
                await conn.execute(
                    update(runs)
                    .where(runs.c.id == run_id)
                    .values(
                        model=record.model,
                        tool_calls=record.tool_calls,
                        iterations=record.iterations,
                        prompt_tokens=record.prompt_tokens,
                        completion_tokens=record.completion_tokens,
                        finished_at=utcnow(),
                        duration_ms=round((time.monotonic() - started) * 1000),
                        outcome=record.outcome,
                        error=record.error,
                    )
                )
            self.inbox.wake([r.event_id for r in rows])
            self.on_outbox()
            await self._publish(lease.key, session.id, [final], seqs, run_id=run_id)

        return RunHooks(load_window=load_window, append=append, finish=finish)

    async def _session_command(self, lease: SessionLease, row: InboxRow, command: str) -> None:
        event = row.event
        async with self._fenced(lease) as conn:
            closed = await self.store.close_current(conn, lease.key)
            await Inbox.mark(conn, [row.id], "done", bump_attempts=True)
            if not event.metadata.get("silent"):
                await insert_outbox(
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
                await insert_outbox(
                    conn,
                    reply_for(row.event, "Sorry, I could not process your message."),
                    session_id=None,
                    run_id=None,
                    event_id=row.event_id,
                )
        log.error("events_failed", event_ids=[r.event_id for r in rows])
        self.inbox.wake([r.event_id for r in rows])
        self.on_outbox()

    async def _publish(
        self,
        key: str,
        session_id: int,
        new: Sequence[ChatMessage],
        seqs: Sequence[int],
        *,
        run_id: int | None = None,
    ) -> None:
        """Tell watchers (browser gateway) about committed messages, after the commit."""
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


def _user_message(event: InboundEvent) -> ChatMessage:
    others = tuple(p.model_dump(mode="json") for p in event.parts if p.type != "text")
    return ChatMessage(
        role="user",
        content=event.text,
        parts=others or None,
        event_id=event.event_id,
        name=None,
    )
