"""Admin REST API: sessions, history, runs and the pipeline's queues (bearer ADMIN_TOKEN).

Session keys go into paths percent-encoded (`telegram%3A42`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query

from app.api.deps import INT32_MAX, INT64_MAX, get_runtime, require_admin
from app.api.routes import keypath as _keypath  # noqa: F401  (registers {key:key})
from app.events import InboundEvent, TextPart
from app.runtime import Runtime
from app.sessions import lease as leases
from app.sessions import queries
from app.sessions.lease import SessionLease
from app.sessions.store import SessionStatus

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[Depends(require_admin)])


@router.get("/sessions")
async def list_sessions(
    channel: str | None = None,
    status: str | None = None,
    key: str | None = None,
    key_prefix: str | None = None,
    q: str | None = Query(None, description="Search in keys and message text"),
    include_archived: bool = False,
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=INT64_MAX),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Sessions, newest activity first (archived ones only when asked for)."""
    items = await queries.list_sessions(
        runtime.engine,
        channel=channel,
        status=status,
        key=key,
        key_prefix=key_prefix,
        text=q,
        include_archived=include_archived,
        limit=limit,
        offset=offset,
    )
    return {"sessions": items}


@asynccontextmanager
async def _key_lease(runtime: Runtime, key: str) -> AsyncIterator[SessionLease]:
    """Admin writes take the key's lease like a worker, so they never race a running turn."""
    lease = await leases.acquire(runtime.engine, key, f"admin:{uuid.uuid4().hex[:8]}", ttl=30)
    if lease is None:
        raise HTTPException(409, "the session is being worked on right now; try again shortly")
    try:
        yield lease
    finally:
        await leases.release(runtime.engine, lease)


async def _current(runtime: Runtime, key: str, generation: int | None = None) -> dict[str, Any]:
    if generation is not None:
        found = await queries.session_by_generation(runtime.engine, key, generation)
    else:
        found = await queries.current_session(runtime.engine, key)
    if found is None:
        raise HTTPException(404, f"no session with key {key!r}")
    return found


@router.get("/sessions/{key:key}/messages")
async def session_messages(
    key: str,
    generation: int | None = Query(None, ge=1, le=INT32_MAX),
    after_seq: int = Query(0, ge=0, le=INT64_MAX),
    limit: int = Query(1000, ge=1, le=10000),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """The messages of the key's current (or given) generation, in order, with tool calls."""
    session = await _current(runtime, key, generation)
    items = await queries.session_messages(runtime.engine, session["id"], after_seq=after_seq, limit=limit)
    return {"key": key, "generation": session["generation"], "messages": items}


@router.get("/sessions/{key:key}/runs")
async def session_runs(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Run traces of the key (newest first): model, tool calls, tokens, timing, outcome."""
    return {"key": key, "runs": await queries.session_runs(runtime.engine, key)}


@router.post("/sessions/{key:key}/reset", status_code=202)
async def reset_session(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Close the current generation. Queued behind the key's events, like a user's /reset."""
    await _current(runtime, key)
    event = InboundEvent(
        channel="admin",
        chat_id=key,
        sender_id="admin",
        parts=(TextPart(text="/reset"),),
        session_key_override=key,
        metadata={"silent": True},
    )
    [result] = await runtime.ingest.submit([event])
    return {"event_id": result.event_id, "session_key": key}


@router.post("/sessions/{key:key}/archive")
async def archive_session(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Archive the current generation (kept and readable, hidden from default lists)."""
    session = await _current(runtime, key)
    async with _key_lease(runtime, key) as lease:
        await runtime.sessions.set_status(session["id"], SessionStatus.ARCHIVED, lease=lease)
    return {"key": key, "generation": session["generation"], "status": "archived"}


@router.post("/sessions/{key:key}/reopen")
async def reopen_session(
    key: str, generation: int = Query(ge=1, le=INT32_MAX), runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Make an earlier generation the key's current, active one again."""
    session = await _current(runtime, key, generation)
    async with _key_lease(runtime, key) as lease:
        await runtime.sessions.reopen(key, session["id"], lease=lease)
    return {"key": key, "generation": generation, "status": "active"}


@router.get("/sessions/{key:key}")
async def get_session(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """The key's current generation: status, counts, lease."""
    return await _current(runtime, key)


@router.get("/mcp")
async def mcp_servers(runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Each MCP tool server: transport, state (connecting/up/down/stopped), since, why, tools."""
    return {"servers": runtime.mcp.status()}


@router.get("/inbox")
async def list_inbox(
    status: str | None = None, limit: int = Query(100, ge=1, le=1000), runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Accepted events, newest first."""
    return {"events": await queries.pipeline_rows(runtime.engine, "inbox", status=status, limit=limit)}


@router.get("/outbox")
async def list_outbox(
    status: str | None = None, limit: int = Query(100, ge=1, le=1000), runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Replies and their delivery state, newest first."""
    return {"messages": await queries.pipeline_rows(runtime.engine, "outbox", status=status, limit=limit)}
