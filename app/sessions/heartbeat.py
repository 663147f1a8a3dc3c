"""A working session is not idle: while a run works, its session's `last_active_at` is
refreshed every `SESSION_HEARTBEAT_SECONDS`, so the lifecycle sweep never suspends or
expires (and so never cleans the workspace of) a session in the middle of a long run."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import structlog
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import sessions, utcnow
from app.sessions.store import SessionStatus

log = structlog.get_logger(__name__)


async def _beat(engine: AsyncEngine, session_id: int, every: float) -> None:
    while True:
        await asyncio.sleep(every)
        now = utcnow()
        try:
            async with engine.begin() as conn:
                await conn.execute(
                    update(sessions)
                    .where(sessions.c.id == session_id, sessions.c.status == SessionStatus.ACTIVE.value)
                    .values(last_active_at=now, updated_at=now)
                )
        except Exception as exc:  # a missed beat is retried at the next one
            log.warning("session_heartbeat_failed", session_id=session_id, error=str(exc))


@contextlib.asynccontextmanager
async def heartbeat(engine: AsyncEngine | None, session_id: int, every: float) -> AsyncIterator[None]:
    if engine is None or every <= 0:
        yield
        return
    task = asyncio.create_task(_beat(engine, session_id, every), name=f"heartbeat-{session_id}")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
