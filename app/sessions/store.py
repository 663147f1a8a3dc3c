"""Session generations and their append-only history.

Writes take an open connection whose transaction already passed `check_fence`, so the
caller decides what commits together (a final answer, its outbox row and the inbox
status commit as one). Reads use their own short connections.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import String, and_, bindparam, cast, func, or_, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.engine import autocommit
from app.db.models import messages, session_keys, sessions, utcnow
from app.sessions.cache import SessionCache
from app.sessions.lease import SessionLease, check_fence, ensure_key
from app.sessions.messages import ChatMessage
from app.sessions.window import trim_to_legal_window


class SessionStatus(StrEnum):
    ACTIVE = "active"
    SUSPENDED = "suspended"
    EXPIRED = "expired"
    ARCHIVED = "archived"


OPEN_STATUSES = (SessionStatus.ACTIVE.value, SessionStatus.SUSPENDED.value)


@dataclass(frozen=True)
class Lifecycle:
    suspend_after: float = 30 * 60
    expire_after: float = 24 * 3600
    archive_after: float = 7 * 24 * 3600


@dataclass(frozen=True)
class SessionState:
    id: int
    key: str
    generation: int
    channel: str
    status: str
    last_consolidated: int
    next_seq: int
    created_at: datetime
    last_active_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    # Whether the newest message may leave a tool-call group open (a tool result, or an
    # assistant message with calls), as read with the state; None: not known.
    tail_open: bool | None = None

    @property
    def message_count(self) -> int:
        return self.next_seq - 1

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> SessionState:
        return cls(
            id=row["id"],
            key=row["key"],
            generation=row["generation"],
            channel=row["channel"],
            status=row["status"],
            last_consolidated=row["last_consolidated"],
            next_seq=row["next_seq"],
            created_at=row["created_at"],
            last_active_at=row["last_active_at"],
            metadata=row["metadata"] or {},
            tail_open=row.get("tail_open"),
        )


def message_from_row(row: Mapping[Any, Any]) -> ChatMessage:
    return ChatMessage(
        role=row["role"],
        content=row["content"],
        tool_calls=tuple(row["tool_calls"]) if row["tool_calls"] else None,
        tool_call_id=row["tool_call_id"],
        name=row["name"],
        parts=tuple(row["parts"]) if row["parts"] else None,
        event_id=row["event_id"],
        seq=row["seq"],
    )


def message_values(m: ChatMessage, run_id: int | None) -> dict[str, Any]:
    """A message row's own columns (not its session, seq and time)."""
    return {
        "role": m.role,
        "content": m.content,
        "parts": list(m.parts) if m.parts else None,
        "tool_calls": list(m.tool_calls) if m.tool_calls else None,
        "tool_call_id": m.tool_call_id,
        "name": m.name,
        "event_id": m.event_id,
        "run_id": run_id,
    }


# Built once with bound parameters: they run on every turn.
# The newest message may leave a group open: a tool result, or an assistant message whose
# tool_calls is anything but JSON null / [] (unexpected renderings count as "may").
TAIL_OPEN = (
    select(messages.c.id)
    .where(
        messages.c.session_id == sessions.c.id,
        messages.c.seq == sessions.c.next_seq - 1,
        or_(
            messages.c.role == "tool",
            and_(
                messages.c.role == "assistant",
                func.coalesce(cast(messages.c.tool_calls, String), "null") != "null",
                func.coalesce(cast(messages.c.tool_calls, String), "null") != "[]",
            ),
        ),
    )
    .exists()
)
CURRENT = (
    select(sessions, TAIL_OPEN.label("tail_open"))
    .join(session_keys, session_keys.c.current_session_id == sessions.c.id)
    .where(session_keys.c.key == bindparam("k"))
)
BUMP_SEQ = (
    update(sessions)
    .where(sessions.c.id == bindparam("sid"))
    .values(
        next_seq=sessions.c.next_seq + bindparam("n"),
        last_active_at=bindparam("now"),
        updated_at=bindparam("now"),
    )
    .returning(sessions.c.next_seq)
)
_INSERT_MESSAGES = messages.insert()
WINDOW_ALL = (
    select(messages)
    .where(
        messages.c.session_id == bindparam("sid"),
        # `last_consolidated` is read in the same statement: consolidation moves it.
        messages.c.seq
        > select(sessions.c.last_consolidated).where(sessions.c.id == bindparam("sid")).scalar_subquery(),
    )
    .order_by(messages.c.seq.desc())
)
WINDOW = WINDOW_ALL.limit(bindparam("limit"))


class SessionStore:
    def __init__(
        self,
        engine: AsyncEngine,
        default_lifecycle: Lifecycle,
        channel_lifecycles: Mapping[str, Lifecycle] | None = None,
        *,
        cache_size: int = 1024,
    ) -> None:
        self.engine = engine
        self.reader = autocommit(engine)
        self.cache: SessionCache[SessionState] = SessionCache(cache_size)
        self.default_lifecycle = default_lifecycle
        self.channel_lifecycles = dict(channel_lifecycles or {})

    def lifecycle(self, channel: str) -> Lifecycle:
        return self.channel_lifecycles.get(channel, self.default_lifecycle)

    # --- generations (call inside a fenced transaction) -----------------------------

    async def open_current(
        self,
        conn: AsyncConnection,
        key: str,
        channel: str,
        *,
        now: datetime | None = None,
        fence: int | None = None,
    ) -> SessionState:
        """The key's open session, reactivated if suspended; a new generation if none.

        With the caller's lease `fence`, the state is cached while that lease is held
        (see `SessionCache`) and the key is pinned until `release(key)`.
        """
        now = now or utcnow()
        if fence is None:
            return await self._open_current(conn, key, channel, now, key_row=False)
        current = self.cache.get(key, fence=fence)
        if (
            current is None
            or (now - current.last_active_at).total_seconds() > self.lifecycle(current.channel).expire_after
        ):
            current = await self._open_current(conn, key, channel, now, key_row=True)
        # The caller is about to append: remember it as active now.
        self.remember(key, replace(current, last_active_at=now), fence=fence)
        return current

    def remember(self, key: str, state: SessionState, *, fence: int) -> None:
        """Cache `state`, just written under the lease `fence`, as `open_current` does."""
        if not self.cache.pinned(key):
            self.cache.pin(key)
        self.cache.put(key, replace(state, tail_open=None), fence=fence)

    def release(self, key: str) -> None:
        """The worker let go of the key: its state may be evicted (it is stale anyway)."""
        self.cache.invalidate(key)
        self.cache.unpin(key)

    async def _open_current(
        self, conn: AsyncConnection, key: str, channel: str, now: datetime, *, key_row: bool
    ) -> SessionState:
        """`key_row`: the key's row is known to exist (its lease is held), no need to ensure it."""
        current = await self._current(conn, key)
        if current is not None and current.status in OPEN_STATUSES:
            idle = (now - current.last_active_at).total_seconds()
            if idle <= self.lifecycle(current.channel).expire_after:
                if current.status != SessionStatus.ACTIVE:
                    await conn.execute(
                        update(sessions)
                        .where(sessions.c.id == current.id)
                        .values(status=SessionStatus.ACTIVE.value, updated_at=now)
                    )
                    current = replace(current, status=SessionStatus.ACTIVE.value)
                return current
            await self._close(conn, current.id, SessionStatus.EXPIRED, now)
        return await self._create(conn, key, channel, now, key_row=key_row)

    async def close_current(
        self, conn: AsyncConnection, key: str, *, now: datetime | None = None
    ) -> SessionState | None:
        """Expire the key's open session (/new, /reset, /end). History is kept."""
        self.cache.invalidate(key)
        current = await self._current(conn, key)
        if current is None or current.status not in OPEN_STATUSES:
            return None
        await self._close(conn, current.id, SessionStatus.EXPIRED, now or utcnow())
        return current

    async def current(self, conn: AsyncConnection, key: str) -> SessionState | None:
        """The key's newest generation, open or not (inside the caller's transaction)."""
        return await self._current(conn, key)

    async def _current(self, conn: AsyncConnection, key: str) -> SessionState | None:
        row = (await conn.execute(CURRENT, {"k": key})).mappings().first()
        return SessionState.from_row(row) if row else None

    async def _create(
        self, conn: AsyncConnection, key: str, channel: str, now: datetime, *, key_row: bool
    ) -> SessionState:
        if not key_row:
            await ensure_key(conn, key)
        last_gen = (
            await conn.execute(select(func.max(sessions.c.generation)).where(sessions.c.key == key))
        ).scalar()
        values: dict[str, Any] = dict(
            key=key,
            generation=(last_gen or 0) + 1,
            channel=channel,
            status=SessionStatus.ACTIVE.value,
            last_consolidated=0,
            next_seq=1,
            created_at=now,
            updated_at=now,
            last_active_at=now,
            metadata={},
        )
        new_id = (
            await conn.execute(sessions.insert().values(**values).returning(sessions.c.id))
        ).scalar_one()
        await conn.execute(
            update(session_keys).where(session_keys.c.key == key).values(current_session_id=new_id)
        )
        return SessionState(
            id=new_id,
            key=key,
            generation=values["generation"],
            channel=channel,
            status=SessionStatus.ACTIVE.value,
            last_consolidated=0,
            next_seq=1,
            created_at=now,
            last_active_at=now,
            tail_open=False,
        )

    async def _close(
        self, conn: AsyncConnection, session_id: int, status: SessionStatus, now: datetime
    ) -> None:
        await conn.execute(
            update(sessions)
            .where(sessions.c.id == session_id)
            .values(status=status.value, closed_at=now, updated_at=now)
        )

    # --- history ------------------------------------------------------------------

    async def append(
        self,
        conn: AsyncConnection,
        session_id: int,
        new_messages: Sequence[ChatMessage],
        *,
        run_id: int | None = None,
        now: datetime | None = None,
    ) -> list[int]:
        """Append messages with dense sequence numbers; earlier rows are never touched."""
        if not new_messages:
            return []
        now = now or utcnow()
        n = len(new_messages)
        next_seq = (await conn.execute(BUMP_SEQ, {"sid": session_id, "n": n, "now": now})).scalar_one()
        first = next_seq - n
        rows = [
            {**message_values(m, run_id), "session_id": session_id, "seq": first + i, "created_at": now}
            for i, m in enumerate(new_messages)
        ]
        await conn.execute(_INSERT_MESSAGES, rows)
        return [first + i for i in range(n)]

    async def load_window(
        self,
        session: SessionState,
        *,
        max_messages: int | None,
        max_tokens: int | None = None,
    ) -> list[ChatMessage]:
        """The model's view: reads only the newest `max_messages` after `last_consolidated`."""
        query, params = (
            (WINDOW_ALL, {"sid": session.id})
            if max_messages is None
            else (WINDOW, {"sid": session.id, "limit": max_messages})
        )
        async with self.reader.connect() as conn:
            rows = (await conn.execute(query, params)).mappings().all()
        history = [message_from_row(r) for r in reversed(rows)]
        return trim_to_legal_window(history, max_messages=max_messages, max_tokens=max_tokens)

    async def tail(
        self, session_id: int, limit: int, *, conn: AsyncConnection | None = None
    ) -> list[ChatMessage]:
        """The newest `limit` messages regardless of consolidation (for resume checks).

        With `conn`, read inside the caller's transaction (it is about to append).
        """
        query = (
            select(messages)
            .where(messages.c.session_id == session_id)
            .order_by(messages.c.seq.desc())
            .limit(limit)
        )
        if conn is not None:
            rows = (await conn.execute(query)).mappings().all()
        else:
            async with self.reader.connect() as own:
                rows = (await own.execute(query)).mappings().all()
        return [message_from_row(r) for r in reversed(rows)]

    async def has_event(self, conn: AsyncConnection, session_id: int, event_id: str) -> bool:
        row = (
            await conn.execute(
                select(messages.c.id)
                .where(messages.c.session_id == session_id, messages.c.event_id == event_id)
                .limit(1)
            )
        ).first()
        return row is not None

    async def message_count(self, session_id: int) -> int:
        async with self.reader.connect() as conn:
            counted = await conn.execute(
                select(func.count()).select_from(messages).where(messages.c.session_id == session_id)
            )
            return int(counted.scalar_one())

    async def all_messages(self, session_id: int) -> list[ChatMessage]:
        async with self.reader.connect() as conn:
            rows = (
                (
                    await conn.execute(
                        select(messages).where(messages.c.session_id == session_id).order_by(messages.c.seq)
                    )
                )
                .mappings()
                .all()
            )
        return [message_from_row(r) for r in rows]

    # --- lifecycle ----------------------------------------------------------------

    async def sweep(self, *, now: datetime | None = None) -> dict[str, int]:
        """Suspend, expire and archive idle sessions; returns how many moved where."""
        now = now or utcnow()
        counts = {"suspended": 0, "expired": 0, "archived": 0}
        groups: list[tuple[Lifecycle, Any]] = [
            (lc, sessions.c.channel == name) for name, lc in self.channel_lifecycles.items()
        ]
        groups.append((self.default_lifecycle, sessions.c.channel.not_in(list(self.channel_lifecycles))))
        async with self.engine.begin() as conn:
            for lc, channel_filter in groups:
                expired = await conn.execute(
                    update(sessions)
                    .where(
                        channel_filter,
                        sessions.c.status.in_(OPEN_STATUSES),
                        sessions.c.last_active_at < now - timedelta(seconds=lc.expire_after),
                    )
                    .values(status=SessionStatus.EXPIRED.value, closed_at=now, updated_at=now)
                )
                suspended = await conn.execute(
                    update(sessions)
                    .where(
                        channel_filter,
                        sessions.c.status == SessionStatus.ACTIVE.value,
                        sessions.c.last_active_at < now - timedelta(seconds=lc.suspend_after),
                    )
                    .values(status=SessionStatus.SUSPENDED.value, updated_at=now)
                )
                archived = await conn.execute(
                    update(sessions)
                    .where(
                        channel_filter,
                        sessions.c.status == SessionStatus.EXPIRED.value,
                        sessions.c.closed_at < now - timedelta(seconds=lc.archive_after),
                    )
                    .values(status=SessionStatus.ARCHIVED.value, updated_at=now)
                )
                counts["expired"] += expired.rowcount
                counts["suspended"] += suspended.rowcount
                counts["archived"] += archived.rowcount
        return counts

    async def set_status(self, session_id: int, status: SessionStatus, *, lease: SessionLease) -> None:
        """Admin action (archive) under the key's lease, like every write. Deletes nothing."""
        self.cache.invalidate_where(lambda state: state.id == session_id)
        now = utcnow()
        values: dict[str, Any] = {"status": status.value, "updated_at": now}
        if status in (SessionStatus.EXPIRED, SessionStatus.ARCHIVED):
            values["closed_at"] = now
        if status is SessionStatus.ACTIVE:
            values["last_active_at"] = now
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            await conn.execute(update(sessions).where(sessions.c.id == session_id).values(**values))

    async def reopen(self, key: str, session_id: int, *, lease: SessionLease) -> None:
        """Make an earlier generation the key's current one again (admin, under the lease)."""
        self.cache.invalidate(key)
        async with self.engine.begin() as conn:
            await check_fence(conn, lease)
            now = utcnow()
            current = await self._current(conn, key)
            if current is not None and current.id != session_id and current.status in OPEN_STATUSES:
                await self._close(conn, current.id, SessionStatus.EXPIRED, now)
            await conn.execute(
                update(sessions)
                .where(and_(sessions.c.id == session_id, sessions.c.key == key))
                .values(status=SessionStatus.ACTIVE.value, closed_at=None, updated_at=now, last_active_at=now)
            )
            await conn.execute(
                update(session_keys).where(session_keys.c.key == key).values(current_session_id=session_id)
            )


# --- consolidation (app.memory.consolidation) ---------------------------------------


async def advance_consolidated(conn: AsyncConnection, session_id: int, seq: int, *, expected: int) -> bool:
    """Move `last_consolidated` from `expected` to `seq`, inside the caller's fenced transaction.

    Compare-and-set on the freshly re-read value: False (nothing written) when the row
    changed since, or when `seq` is not ahead of it and inside the history.
    """
    if seq <= expected:
        return False
    result = await conn.execute(
        update(sessions)
        .where(
            sessions.c.id == session_id,
            sessions.c.last_consolidated == expected,
            sessions.c.next_seq > seq,
        )
        .values(last_consolidated=seq)
    )
    return result.rowcount == 1
