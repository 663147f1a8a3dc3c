"""The session a gateway connection is attached to: its `ready` frame, then its events.

Subscribe first, then read the history: nothing committed after the read can be missed,
and what both deliver is dropped by seq. The pump turns bus events into frames,
de-duplicated and gap-filled by seq from the database (`app.gateway.history`); it never
waits on the client (`emit` raises `TooSlow` instead).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

import structlog

from app.gateway import history
from app.gateway.host import GatewayHost, TooSlow
from app.gateway.protocol import AttachFrame

log = structlog.get_logger(__name__)

BUS_QUEUE_SIZE = 1000  # events between the bus and the pump; the pump never waits on the client


class SessionFeed:
    """One connection's attached session key (at most one at a time)."""

    def __init__(self, hub: GatewayHost, emit: Callable[[dict[str, Any]], None]) -> None:
        self.hub = hub
        self.emit = emit
        self.key: str | None = None
        self.session_id: int | None = None
        self.last_seq = 0
        self._subscription: AsyncExitStack | None = None
        self._pump: asyncio.Task[None] | None = None
        self._queue: asyncio.Queue[dict[str, Any]] | None = None

    async def attach(self, key: str, frame: AttachFrame) -> dict[str, Any]:
        """Follow `key` from now on; the `ready` frame to send first. Raises if the
        subscription or the read failed (nothing is attached then)."""
        await self.detach()
        stack = AsyncExitStack()
        try:
            queue = await stack.enter_async_context(self.hub.bus.subscribe(key, maxsize=BUS_QUEUE_SIZE))
            ready = await self._ready_frame(key, frame)
        except BaseException:
            await stack.aclose()
            raise
        self._subscription = stack
        self.key = key
        self._queue = queue
        return ready

    def start(self) -> None:
        """Start delivering the bus's events (after the `ready` frame was queued)."""
        assert self._queue is not None
        self._pump = asyncio.create_task(self._pump_loop(self._queue))

    def cancel(self) -> None:
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()

    async def _ready_frame(self, key: str, frame: AttachFrame) -> dict[str, Any]:
        """Read the key's current generation: what the client missed, or recent history."""
        settings = self.hub.settings
        engine = self.hub.engine
        current = await history.current_session(engine, key)
        messages: list[dict[str, Any]] = []
        truncated = False
        self.session_id, self.last_seq = None, 0
        if current is not None:
            self.session_id = current.id
            since = frame.last_seq
            resumable = (
                since is not None and frame.session_id in (None, current.id) and since <= current.last_seq
            )
            if resumable and since is not None:
                messages = await history.messages_between(
                    engine, key, current.id, after_seq=since, limit=settings.gateway_resume_limit + 1
                )
                if len(messages) > settings.gateway_resume_limit:
                    resumable = False
                else:
                    self.last_seq = messages[-1]["seq"] if messages else since
            if not resumable:
                # Not a continuation of what the client has: it must replace its view.
                truncated = bool(since)
                messages = await history.recent_messages(
                    engine, key, current.id, limit=settings.gateway_history_limit
                )
                self.last_seq = messages[-1]["seq"] if messages else 0
        return {
            "type": "ready",
            "session_key": key,
            "session_id": current.id if current else None,
            "generation": current.generation if current else None,
            "status": current.status if current else None,
            "messages": messages,
            "last_seq": self.last_seq,
            "truncated": truncated,
            "pending_approvals": await history.pending_approvals(engine, key),
        }

    async def detach(self) -> None:
        if self._pump is not None and self._pump is not asyncio.current_task():
            self._pump.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._pump
        self._pump = None
        if self._subscription is not None:
            with contextlib.suppress(Exception):
                await self._subscription.aclose()
        self._subscription = None
        self._queue = None
        self.key = None
        self.session_id = None
        self.last_seq = 0

    async def _pump_loop(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        while True:
            event = await queue.get()
            try:
                await self._deliver(event)
            except TooSlow:
                return
            except Exception:
                log.exception("gateway_deliver_failed", session_key=self.key)

    async def _deliver(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("resync", "overflow"):
            await self._catch_up()
            return
        if kind != "message":
            self.emit(event)
            return
        session_id, seq = event.get("session_id"), event.get("seq")
        if not isinstance(session_id, int) or not isinstance(seq, int):
            return
        if session_id != self.session_id:
            if self.session_id is not None and session_id < self.session_id:
                return  # a late event of an older generation
            self._new_session(session_id)
        if seq <= self.last_seq:
            return  # already sent (from the history read, or twice on the bus)
        if seq > self.last_seq + 1:
            await self._fill(before_seq=seq)  # published out of order, or a replica's NOTIFY lagged
        self.emit(event)
        self.last_seq = seq

    def _new_session(self, session_id: int) -> None:
        self.emit({"type": "new_session", "session_key": self.key, "session_id": session_id})
        self.session_id = session_id
        self.last_seq = 0

    async def _fill(self, before_seq: int | None = None) -> None:
        assert self.key is not None and self.session_id is not None
        rows = await history.messages_between(
            self.hub.engine,
            self.key,
            self.session_id,
            after_seq=self.last_seq,
            before_seq=before_seq,
            limit=self.hub.settings.gateway_resume_limit,
        )
        for row in rows:
            self.emit(row)
            self.last_seq = row["seq"]

    async def _catch_up(self) -> None:
        """The bus may have lost events: read what the database has after our last seq."""
        assert self.key is not None
        current = await history.current_session(self.hub.engine, self.key)
        if current is None:
            return
        if current.id != self.session_id:
            if self.session_id is not None and current.id < self.session_id:
                return
            self._new_session(current.id)
        await self._fill()
