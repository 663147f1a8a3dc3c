"""Session event bus: who is watching a session learns what happens in it.

The turn handler publishes every message it commits (and streaming deltas, approval
requests …) under the session key; the browser gateway subscribes. `LocalSessionBus`
fans out inside one process; a cross-replica implementation (PostgreSQL LISTEN/NOTIFY)
implements the same protocol.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Protocol


def is_session_key(key: str) -> bool:
    """Session keys always hold a ':' (`channel:…`); a bus key without one is a topic of
    the gateway's own (such as `%handoffs`, `app.agents.handoff`), not a session."""
    return ":" in key


class SessionBus(Protocol):
    async def publish(self, key: str, event: dict[str, Any], *, remote: bool = True) -> None:
        """Deliver `event` (JSON-able, has a "type") to every subscriber of `key`.

        `remote=False`: the caller learned under the key's lease that no other replica
        watches it (`app.pg_bus`): only this process's subscribers get it.
        """
        ...

    def subscribe(self, key: str, maxsize: int = 1000) -> Any:
        """`async with bus.subscribe(key) as queue:` receive the key's events."""
        ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class SubscriberOverflow(Exception):
    """A subscriber's queue was full; it missed events and must resync."""


class LocalSessionBus:
    def __init__(self) -> None:
        self._subscribers: dict[str, set[asyncio.Queue[dict[str, Any]]]] = defaultdict(set)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def publish(self, key: str, event: dict[str, Any], *, remote: bool = True) -> None:
        self.deliver_local(key, event)

    def deliver_local(self, key: str, event: dict[str, Any]) -> None:
        for queue in list(self._subscribers.get(key, ())):
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                # A slow subscriber never slows the session: it gets an overflow marker
                # in place of the newest events and is expected to disconnect/resync.
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait({"type": "overflow"})

    @asynccontextmanager
    async def subscribe(self, key: str, maxsize: int = 1000) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(maxsize=maxsize)
        self._subscribers[key].add(queue)
        try:
            yield queue
        finally:
            self._subscribers[key].discard(queue)
            if not self._subscribers[key]:
                del self._subscribers[key]

    def subscriber_count(self, key: str) -> int:
        return len(self._subscribers.get(key, ()))
