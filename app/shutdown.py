"""SIGTERM is a hand-over: a replica that is told to stop gives its work to the others at once.

A rolling upgrade, a `docker compose up` of a new image, a Kubernetes eviction: each
stops a replica with SIGTERM, and waiting for its leases to expire would hold its
sessions, its platform connections and its claimed replies up for a lease TTL. Instead,
in this order:

1. stop accepting: `/readyz` answers 503 (load balancers stop sending), and channel
   requests that still arrive get 503 with `Retry-After` (platforms and senders retry
   them elsewhere; nothing was stored);
2. long-lived platform connections end (a poll in flight first) and release their
   leases with their resume state (Telegram's offset, Discord's session): another
   replica takes them at once (`app.connection_leases`);
3. turns in flight finish within `SHUTDOWN_GRACE_SECONDS`; every session lease is
   given up (a turn still running then is cancelled: its attempt is counted, its
   history legal, and the replica that takes the key runs the event again);
4. the replies those turns wrote are sent, and claims of deliveries that could not
   finish are given up.

Then the runtime stops the rest. Steps 2 and 3 run side by side.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class _Turns(Protocol):
    async def hand_over(self, grace: float) -> int: ...


class _Connections(Protocol):
    async def hand_over(self, grace: float) -> None: ...


class _Replies(Protocol):
    async def stop(self, grace: float = ...) -> None: ...


@dataclass(frozen=True)
class HandedOver:
    seconds: float  # from the signal to everything given up
    cancelled_turns: int  # turns still running after the grace (their events run elsewhere)


class HandOver:
    """The stop of one replica (see the module); `begin()` then `await run()`, once."""

    def __init__(
        self,
        *,
        turns: _Turns,
        connections: _Connections,
        replies: _Replies,
        grace: float,
        retry_after: int = 2,
    ) -> None:
        self.turns = turns
        self.connections = connections
        self.replies = replies
        self.grace = grace
        self.retry_after = retry_after  # what a refused channel request is told
        self.stopping = False
        self._task: asyncio.Task[HandedOver] | None = None

    def begin(self) -> None:
        """Refuse new work from now on (readiness and channel requests)."""
        self.stopping = True

    async def run(self, grace: float | None = None) -> HandedOver:
        """Hand everything over within `grace` (default: the configured one); a second call
        waits for the first one's result."""
        self.begin()
        if self._task is None:
            within = self.grace if grace is None else grace
            self._task = asyncio.create_task(self._run(within), name="hand-over")
        return await asyncio.shield(self._task)

    async def _run(self, grace: float) -> HandedOver:
        started = time.monotonic()
        log.info("hand_over_started", grace=grace)
        connections = asyncio.create_task(self.connections.hand_over(grace))
        cancelled = await self.turns.hand_over(grace)
        left = max(5.0, grace - (time.monotonic() - started))  # deliveries in flight end
        await self.replies.stop(left)
        await connections
        done = HandedOver(seconds=time.monotonic() - started, cancelled_turns=cancelled)
        log.info("hand_over_done", seconds=round(done.seconds, 3), cancelled_turns=cancelled)
        return done
