"""`WS /admin/api/live`: tells the dashboard that something changed, so every page is live.

The dashboard keeps one WebSocket open and re-reads the page it shows when a `change`
frame arrives. The server compares a small fingerprint of the database (newest ids and
pending counts of inbox, outbox, runs, approvals and sessions) every
`LIVE_POLL_SECONDS`: one cheap query per open dashboard, nothing sent while nothing
changes. Authentication is the admin API's (the dashboard's cookie travels with the
upgrade request; a bearer header works for scripts); a cross-site page cannot open it
(the cookie is SameSite=Strict, and a foreign `Origin` is refused). A WebSocket, not
Server-Sent Events, because the server closes WebSockets when it shuts down, while an
open event stream would hold a graceful shutdown up.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, HTTPException, Request, WebSocket
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.deps import require_admin
from app.db.models import approvals, inbox, outbox, runs, sessions
from app.runtime import Runtime

router = APIRouter()

LIVE_POLL_SECONDS = 1.0
CLOSE_UNAUTHORIZED = 4001
CLOSE_DISABLED = 4503


def _count(table: Any, condition: Any) -> Any:
    return select(func.count()).select_from(table).where(condition).scalar_subquery()


_FINGERPRINT = select(
    select(func.max(inbox.c.id)).scalar_subquery(),
    _count(inbox, inbox.c.status.in_(("pending", "processing"))),
    select(func.max(outbox.c.id)).scalar_subquery(),
    _count(outbox, outbox.c.status.in_(("pending", "sending"))),
    select(func.max(runs.c.id)).scalar_subquery(),
    _count(runs, runs.c.finished_at.is_(None)),
    select(func.max(approvals.c.id)).scalar_subquery(),
    _count(approvals, approvals.c.status == "pending"),
    select(func.max(sessions.c.id)).scalar_subquery(),
    _count(sessions, sessions.c.status == "active"),
)


async def fingerprint(engine: AsyncEngine) -> tuple[Any, ...]:
    """Changes whenever an event, a reply, a run, an approval or a session appears or moves on."""
    async with engine.connect() as conn:
        row = (await conn.execute(_FINGERPRINT)).one()
    return tuple(row)


def _same_origin(ws: WebSocket) -> bool:
    origin = ws.headers.get("origin")
    if origin is None:  # not a browser (scripts authenticate with the bearer token)
        return True
    return urlsplit(origin).netloc == ws.headers.get("host")


@router.websocket("/admin/api/live")
async def live(ws: WebSocket) -> None:
    """`{"type": "hello"}` once, then `{"type": "change"}` whenever something changed."""
    try:
        # The admin API's own check, on the upgrade request (a GET).
        await require_admin(Request({**ws.scope, "type": "http", "method": "GET"}))
        authorized = _same_origin(ws)
    except HTTPException as exc:
        authorized = False
        if exc.status_code == 503:
            await ws.close(CLOSE_DISABLED, "admin API disabled")
            return
    if not authorized:
        await ws.close(CLOSE_UNAUTHORIZED, "not signed in")
        return
    await ws.accept()
    runtime: Runtime = ws.app.state.runtime
    last = await fingerprint(runtime.engine)
    await ws.send_json({"type": "hello"})
    receiving = asyncio.ensure_future(ws.receive())
    try:
        while True:
            done, _ = await asyncio.wait({receiving}, timeout=LIVE_POLL_SECONDS)
            if done:
                if receiving.result()["type"] == "websocket.disconnect":
                    return
                receiving = asyncio.ensure_future(ws.receive())  # pings and the like: ignored
                continue
            now = await fingerprint(runtime.engine)
            if now != last:
                last = now
                await ws.send_json({"type": "change"})
    finally:
        receiving.cancel()
        with contextlib.suppress(BaseException):
            await receiving
