"""A working session is not idle: while a run works, its session's `last_active_at` is
refreshed every `SESSION_HEARTBEAT_SECONDS`, so the lifecycle sweep never suspends or
expires (and so never cleans the workspace of) a session in the middle of a long run.

One beat for every session working in this process: a turn adds its session to the set
and takes it out when it ends (no task of its own per turn, which cost a task, a timer
and a cancellation on every event); while the set is not empty, one statement every
`every` seconds refreshes them all. A session's first refresh comes at most `every`
seconds after its run started, and then every `every` seconds until it ends.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from types import TracebackType

import structlog
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import sessions, utcnow
from app.sessions.store import SessionStatus

log = structlog.get_logger(__name__)


class Heartbeats:
    """The sessions working in this process, refreshed together (see the module)."""

    def __init__(self, engine: AsyncEngine | None, every: float) -> None:
        self.engine = engine
        self.every = every
        self._working: Counter[int] = Counter()  # session id: runs working in it
        self._task: asyncio.Task[None] | None = None

    def working(self, session_id: int) -> _Working:
        """`async with heartbeats.working(session_id):` the session stays active meanwhile."""
        return _Working(self, session_id)

    def _add(self, session_id: int) -> None:
        if self.engine is None or self.every <= 0:
            return
        self._working[session_id] += 1
        if self._task is None:
            self._task = asyncio.create_task(self._run(self.engine), name="session-heartbeats")

    def _remove(self, session_id: int) -> None:
        if session_id in self._working:
            self._working[session_id] -= 1
            if self._working[session_id] <= 0:
                del self._working[session_id]

    async def _run(self, engine: AsyncEngine) -> None:
        try:
            while self._working:
                await asyncio.sleep(self.every)
                if self._working:
                    await self._beat(engine, list(self._working))
        finally:
            self._task = None  # the next run to start starts the beat again

    @staticmethod
    async def _beat(engine: AsyncEngine, session_ids: list[int]) -> None:
        now = utcnow()
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    update(sessions)
                    .where(sessions.c.id.in_(session_ids), sessions.c.status == SessionStatus.ACTIVE.value)
                    .values(last_active_at=now, updated_at=now)
                )
        except Exception as exc:  # a missed beat is retried at the next one
            log.warning("session_heartbeat_failed", sessions=len(session_ids), error=str(exc))


class _Working:
    __slots__ = ("beats", "session_id")

    def __init__(self, beats: Heartbeats, session_id: int) -> None:
        self.beats = beats
        self.session_id = session_id

    async def __aenter__(self) -> None:
        self.beats._add(self.session_id)

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.beats._remove(self.session_id)
