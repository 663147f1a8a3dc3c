"""`GET /admin/api/live`: Server-Sent Events telling the dashboard that something changed.

The dashboard keeps one EventSource open and re-reads the page it shows when a `change`
event arrives, so every page is live without each page polling. The server compares a
small fingerprint of the database (newest ids and pending counts of inbox, outbox, runs,
approvals, the sessions' newest change) every `LIVE_POLL_SECONDS`; one cheap query per
open dashboard, and nothing is sent while nothing changes (only a comment every
`KEEPALIVE_SECONDS` so proxies keep the connection). A connection ends after
`MAX_STREAM_SECONDS` and the browser reconnects by itself (`retry`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.deps import get_runtime, require_admin
from app.db.models import approvals, inbox, outbox, runs, sessions
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api", tags=["admin dashboard"], dependencies=[Depends(require_admin)])

LIVE_POLL_SECONDS = 1.0
KEEPALIVE_SECONDS = 15.0
MAX_STREAM_SECONDS = 300.0


def _pending(table: Any, *statuses: str) -> Any:
    return select(func.count()).select_from(table).where(table.c.status.in_(statuses)).scalar_subquery()


_FINGERPRINT = select(
    select(func.max(inbox.c.id)).scalar_subquery(),
    _pending(inbox, "pending", "processing"),
    select(func.max(outbox.c.id)).scalar_subquery(),
    _pending(outbox, "pending", "sending"),
    select(func.max(runs.c.id)).scalar_subquery(),
    select(func.count()).select_from(runs).where(runs.c.finished_at.is_(None)).scalar_subquery(),
    select(func.max(approvals.c.id)).scalar_subquery(),
    _pending(approvals, "pending"),
    select(func.max(sessions.c.id)).scalar_subquery(),
    _pending(sessions, "active"),
)


async def fingerprint(engine: AsyncEngine) -> tuple[Any, ...]:
    async with engine.connect() as conn:
        row = (await conn.execute(_FINGERPRINT)).one()
    return tuple(row)


async def _events(request: Request, engine: AsyncEngine) -> AsyncIterator[str]:
    yield "retry: 2000\n\n"
    last = await fingerprint(engine)
    yield f"event: hello\ndata: {json.dumps({'at': time.time()})}\n\n"
    started = quiet_since = time.monotonic()
    while time.monotonic() - started < MAX_STREAM_SECONDS:
        await asyncio.sleep(LIVE_POLL_SECONDS)
        if await request.is_disconnected():
            return
        now = await fingerprint(engine)
        if now != last:
            last = now
            quiet_since = time.monotonic()
            yield f"event: change\ndata: {json.dumps({'at': time.time()})}\n\n"
        elif time.monotonic() - quiet_since > KEEPALIVE_SECONDS:
            quiet_since = time.monotonic()
            yield ": keep-alive\n\n"


@router.get("/live", response_class=StreamingResponse)
async def live(request: Request, runtime: Runtime = Depends(get_runtime)) -> StreamingResponse:
    """An event stream (`text/event-stream`): `hello` once, then `change` whenever
    inbox, outbox, runs, approvals or sessions changed."""
    return StreamingResponse(
        _events(request, runtime.engine),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
