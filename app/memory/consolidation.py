"""Consolidation: fold the old part of a long session into memory, under its lease.

When the unconsolidated part of a session (messages after `last_consolidated`) passes
a message or token threshold, its older part is summarized into session memory, stable
facts its users stated go to their user memory, and `last_consolidated` advances to a
**legal boundary**: the first message after it is a user message and no tool-call group
straddles it, so the model window that starts there is still a legal provider input.

It runs as an after-turn hook of the turn handler, i.e. by the worker that holds the
key's lease. The history is read and summarized without a transaction (a model call may
take a while); the writes then happen in one transaction that checks the lease fence,
re-reads the session row and advances `last_consolidated` only from the value the
summary was built on (compare-and-set). Messages are append-only, so what was read up
to the boundary cannot have changed; anything appended meanwhile lies after it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.engine import autocommit
from app.db.models import inbox, messages, sessions
from app.memory.identity import identity_of, is_person, resolve_owner
from app.memory.store import DEFAULT_NAMESPACE, Scope, content_key, put_memory
from app.memory.summarize import Summarizer, Summary, extract_facts
from app.sessions.history_marks import visible
from app.sessions.lease import SessionLease, check_fence
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, advance_consolidated, message_from_row

log = structlog.get_logger(__name__)


def choose_boundary(history: Sequence[ChatMessage], *, keep: int) -> int | None:
    """The newest legal new `last_consolidated` for `history` (consecutive seqs), or None.

    Legal: the message right after the boundary is a user message, no tool result after
    it answers a call made at or before it, and at least `keep` messages stay after it.
    """
    n = len(history)
    blocked = [False] * n  # blocked[i]: a boundary right after history[i] splits a group
    issued: dict[str, int] = {}
    for idx, msg in enumerate(history):
        if msg.role == "assistant" and msg.tool_calls:
            for call_id in msg.tool_call_ids:
                issued[call_id] = idx
        elif msg.role == "tool" and msg.tool_call_id in issued:
            for k in range(issued[msg.tool_call_id], idx):
                blocked[k] = True
    for i in range(n - 1 - max(keep, 1), -1, -1):
        if history[i + 1].role == "user" and not blocked[i]:
            seq = history[i].seq
            assert seq is not None
            return seq
    return None


@dataclass(frozen=True)
class ConsolidationLimits:
    threshold_messages: int = 80
    threshold_tokens: int = 12_000
    keep_messages: int = 20
    summary_max_chars: int = 2000
    max_batch: int = 2000  # messages folded in one pass at most


def _fresh_query() -> Any:
    s, m = sessions.alias("s"), messages
    chars = (
        select(func.coalesce(func.sum(func.length(m.c.content)), 0))
        .where(
            m.c.session_id == s.c.id,
            m.c.seq > s.c.last_consolidated,
            m.c.seq <= s.c.last_consolidated + bindparam("window"),
        )
        .scalar_subquery()
    )
    return select(s.c.key, s.c.last_consolidated, s.c.next_seq, chars).where(s.c.id == bindparam("sid"))


_FRESH = _fresh_query()  # built once: it runs after every turn


class Consolidator:
    """`TurnHandler` after-turn hook: `await consolidator(lease, session)`."""

    def __init__(
        self,
        engine: AsyncEngine,
        summarizer: Summarizer,
        limits: ConsolidationLimits,
        *,
        namespace_of: Callable[[str], str] | None = None,
        budget_of: Callable[[str], int | None] | None = None,
    ) -> None:
        self.engine = engine
        self.single = autocommit(engine)
        self.summarizer = summarizer
        self.limits = limits
        # Session key → the serving agent's memory namespace: the summary and the facts
        # are written there.
        self.namespace_of: Callable[[str], str] = namespace_of or (lambda key: DEFAULT_NAMESPACE)
        # Session key → the most the summary request's prompt may cost in tokens (the
        # summarizing model's context less the reply room); None: unbounded.
        self.budget_of: Callable[[str], int | None] = budget_of or (lambda key: None)

    def due(self, session: SessionState) -> bool:
        """Whether consolidation may be due after a turn that left `session` so.

        Its `next_seq` is exact (the turn appended last, under the lease) and its
        `last_consolidated` at most the stored one (only consolidation moves it, forward,
        under the same lease), so the pending count read from it is at least the real one:
        at most `keep_messages` of them means nothing is due, without asking the database.
        """
        return session.next_seq - 1 - session.last_consolidated > self.limits.keep_messages

    async def __call__(self, lease: SessionLease, session: SessionState) -> None:
        """After a turn: consolidate if due (`due`). `session` is as the turn left it."""
        if not self.due(session):
            return
        await self.consolidate(lease, session.id)

    async def _fresh(self, session_id: int) -> tuple[str, int, int, int]:
        """Key, `last_consolidated`, `next_seq` and the text length of the unconsolidated part.

        One statement per turn. The length is summed over at most `threshold_messages`
        rows: beyond that the message count alone decides.
        """
        async with self.single.connect() as conn:
            row = (
                await conn.execute(_FRESH, {"sid": session_id, "window": self.limits.threshold_messages})
            ).one()
        return row[0], row[1], row[2], int(row[3])

    async def consolidate(self, lease: SessionLease, session_id: int, *, force: bool = False) -> int | None:
        """Fold what is due; returns the new `last_consolidated`, or None if nothing moved.

        `force` (/compact): ignore the thresholds and fold all but the newest exchange.
        """
        key, start, next_seq, chars = await self._fresh(session_id)
        if key != lease.key:
            raise ValueError(f"session {session_id} is not under the lease of {lease.key!r}")
        pending = next_seq - 1 - start
        keep_messages = 1 if force else self.limits.keep_messages
        if pending <= keep_messages:
            return None
        # Below the message threshold: estimate tokens (as estimate_tokens does, from the
        # text) without loading the rows on every turn.
        estimate = 4 * pending + chars // 4
        below = pending < self.limits.threshold_messages and estimate < self.limits.threshold_tokens
        if below and not force:
            return None
        async with self.engine.connect() as conn:
            marks = (
                await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session_id))
            ).scalar_one() or {}
            rows = (
                (
                    await conn.execute(
                        select(messages)
                        .where(messages.c.session_id == session_id, messages.c.seq > start)
                        .order_by(messages.c.seq)
                        .limit(self.limits.max_batch)
                    )
                )
                .mappings()
                .all()
            )
        history = [message_from_row(r) for r in rows]
        keep = keep_messages - (pending - len(history))  # rows beyond the batch stay too
        boundary = choose_boundary(history, keep=max(keep, 1))
        if boundary is None:
            return None
        # Turns hidden by /undo or /retry are folded past but neither summarized nor mined.
        folded = visible([m for m in history if m.seq is not None and m.seq <= boundary], marks)
        senders = await self._senders(folded)
        facts = [
            (senders[m.event_id], f"fact:{f.key}", f.content)
            for m in folded
            if m.role == "user" and m.event_id in senders
            for f in extract_facts(m.content or "")
        ]
        speakers = set(senders.values())
        summary = (
            await self.summarizer.summarize(
                folded,
                max_chars=self.limits.summary_max_chars,
                want_facts=len(speakers) == 1,
                budget=self.budget_of(key),
            )
            if folded
            else Summary("")
        )
        if len(speakers) == 1:  # the model's facts can only be about the one sender
            [speaker] = speakers
            facts += [(speaker, content_key(f, "llm"), f) for f in summary.facts]

        namespace = self.namespace_of(key)
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            row = (
                await conn.execute(
                    select(sessions.c.last_consolidated, sessions.c.next_seq).where(
                        sessions.c.id == session_id
                    )
                )
            ).one()
            if row[0] != start or boundary >= row[1]:
                log.warning("consolidation_stale", session_id=session_id, read=start, now=row[0])
                return None
            for identity, fact_key, content in facts:
                owner = await resolve_owner(conn, identity)
                await put_memory(
                    conn,
                    Scope.USER,
                    owner,
                    content,
                    key=fact_key,
                    kind="fact",
                    source_session_id=session_id,
                    namespace=namespace,
                )
            if summary.text.strip():
                await put_memory(
                    conn,
                    Scope.SESSION,
                    key,
                    summary.text,
                    key=f"summary:{session_id}:{start + 1}-{boundary}",
                    kind="summary",
                    source_session_id=session_id,
                    metadata={"from_seq": start + 1, "to_seq": boundary},
                    namespace=namespace,
                )
            if not await advance_consolidated(conn, session_id, boundary, expected=start):
                raise RuntimeError("last_consolidated changed under the lease")  # rolls back
        log.info("session_consolidated", session_id=session_id, upto=boundary, facts=len(facts))
        return boundary

    async def _senders(self, folded: Sequence[ChatMessage]) -> dict[str, str]:
        """Event id → identity of the sender, for the user messages in `folded`."""
        event_ids = {m.event_id for m in folded if m.role == "user" and m.event_id}
        if not event_ids:
            return {}
        async with self.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(inbox.c.event_id, inbox.c.payload).where(inbox.c.event_id.in_(event_ids))
                )
            ).all()
        return {
            event_id: identity_of(str(payload.get("channel", "")), str(payload.get("sender_id", "")))
            for event_id, payload in rows
            if isinstance(payload, dict)
            and payload.get("sender_id")
            and is_person(str(payload.get("channel", "")))
        }
