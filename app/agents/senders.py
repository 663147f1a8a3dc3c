"""Who spoke in which conversation: `session_senders`, for `/sessions` across chats.

A row per (session key, sender identity) is written when an event of that sender is
accepted into that key (`Ingest`'s `on_stored`: after the inbox commit, so events refused
by access or quotas, and duplicates, are never recorded), with the chat it came from and
the time the first one was received. Each process remembers the pairs it wrote, so a conversation
costs one `INSERT … ON CONFLICT DO NOTHING` per sender and process, not one per message.
The rows are written by a background task, many in one statement, off the request's path
(a first message in a chat costs no transaction of its own); a pair lost to a crash before
its write is recorded with the sender's next message there.

`/sessions` lists the generations of the other keys this identity spoke in on the same
channel that were active since it first spoke there: the conversations it could list by
running `/sessions` in that chat itself, nothing more.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import session_senders, sessions
from app.db.upsert import insert_ignore
from app.events import InboundEvent
from app.memory.identity import identity_of, is_person
from app.pipeline.texts import say

log = structlog.get_logger(__name__)

REMEMBERED = 50_000  # (key, identity) pairs a process keeps as written
PENDING = 10_000  # pairs waiting for their write; more are dropped (the next message retries)


class SessionSenders:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self._written: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._pending: dict[tuple[str, str], dict[str, Any]] = {}
        self._writer: asyncio.Task[None] | None = None

    async def record(self, events: Sequence[InboundEvent]) -> None:
        """`Ingest.on_stored`: note the senders of newly stored events; the write happens in
        the background (a failure is logged: the events are stored already and go on)."""
        rows = self._pending
        for event in events:
            if not is_person(event.channel) or not event.sender_id:
                continue
            pair = (event.session_key, identity_of(event.channel, event.sender_id))
            if pair in self._written or pair in rows or len(rows) >= PENDING:
                continue
            rows[pair] = {
                "key": pair[0],
                "identity": pair[1],
                "channel": event.channel,
                "chat_id": event.chat_id,
                "first_at": event.received_at,  # before the turn marks its session active
            }
        if rows and (self._writer is None or self._writer.done()):
            self._writer = asyncio.create_task(self._write(), name="session-senders")

    async def _write(self) -> None:
        while self._pending:
            rows, self._pending = self._pending, {}
            try:
                async with self.engine.begin() as conn:
                    await conn.execute(
                        insert_ignore(conn, session_senders, ["key", "identity"]), list(rows.values())
                    )
            except Exception:
                log.exception("session_senders_failed", count=len(rows))
                continue
            for pair in rows:
                self._written[pair] = None
            while len(self._written) > REMEMBERED:
                self._written.popitem(last=False)

    async def stop(self) -> None:
        """Finish the writes under way (at shutdown)."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer

    async def elsewhere(self, event: InboundEvent, key: str, limit: int) -> list[dict[str, Any]]:
        """Generations of other keys the event's sender spoke in on its channel, newest first."""
        s, ss = sessions, session_senders
        query = (
            select(ss.c.chat_id, s.c.id, s.c.generation, s.c.title, s.c.status, s.c.next_seq, s.c.metadata)
            .select_from(ss.join(s, s.c.key == ss.c.key))
            .where(
                ss.c.identity == identity_of(event.channel, event.sender_id),
                ss.c.channel == event.channel,
                ss.c.key != key,
                s.c.last_active_at >= ss.c.first_at,
                s.c.status != "archived",
            )
            .order_by(s.c.last_active_at.desc(), s.c.id.desc())
            .limit(limit)
        )
        async with self.engine.connect() as conn:
            return [dict(r) for r in (await conn.execute(query)).mappings()]


def elsewhere_lines(rows: Sequence[dict[str, Any]], channel: str, locale: str) -> list[str]:
    """`/sessions`' part about the other chats (nothing when there are none)."""
    if not rows:
        return []
    lines = [say("sessions.elsewhere", locale, channel=channel)]
    for row in rows:
        line = say(
            "sessions.line",
            locale,
            n=row["generation"],
            title=row["title"] or say("untitled", locale),
            messages=row["next_seq"] - 1,
            status=row["status"],
        )
        lines.append(say("sessions.in_chat", locale, chat=row["chat_id"], line=line))
    return lines
