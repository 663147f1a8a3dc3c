"""Long-lived platform connections that must have exactly one holder.

Telegram long polling, Slack Socket Mode, the Discord Gateway and DingTalk Stream mode
are one connection per bot credential: two holders mean duplicate or stolen events. An
adapter never opens such a connection itself; it hands `ChannelContext.hold_connection`
a name and a coroutine function that runs the connection until cancelled:

    self._task = asyncio.create_task(context.hold_connection("discord:<bot id>", self._run_gateway))

`hold_connection` runs forever (until cancelled). It waits until this process holds the
connection named `name`, then awaits `run()`. If the hold is lost (another replica took
it over after this one stalled), `run()` is cancelled and the hold is sought again. If
`run()` returns or raises, the hold is given up and sought again after a short pause.
The name must not contain a secret: use a bot id or a fingerprint of the token
(`fingerprint`).

`LocalConnections` holds every connection at once: the right thing for one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import structlog

log = structlog.get_logger(__name__)

ConnectionRun = Callable[[], Awaitable[None]]
HoldConnection = Callable[[str, ConnectionRun], Awaitable[None]]  # `ChannelContext.hold_connection`


def fingerprint(secret: str) -> str:
    """A short stable name for a credential, safe to store and show (not reversible)."""
    return hashlib.sha256(secret.encode()).hexdigest()[:16]


class HeldConnection:
    """One connection handed to `hold_connection`, run in the background from here until
    `release()` (an adapter's `start` and `stop`):

        self._held = HeldConnection(context.hold_connection, "email:<fingerprint>", self._watch)
        ...
        await self._held.release()
    """

    def __init__(
        self, hold: Callable[[str, ConnectionRun], Awaitable[None]], name: str, run: ConnectionRun
    ) -> None:
        self.name = name
        self._task = asyncio.ensure_future(hold(name, run))

    async def release(self) -> None:
        """Stop the connection and give its hold up; waits until it has."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            try:
                await self._task
            except Exception:  # the connection's own failure: logged, the adapter still stops
                log.exception("connection_failed_on_release", connection=self.name)


class ConnectionStates(Protocol):
    """What a connection's holder keeps for the next holder (a Discord Gateway session to
    RESUME instead of identifying afresh, so that what came meanwhile is replayed)."""

    async def load_state(self, name: str) -> dict[str, Any] | None:
        """The state the last holder of `name` saved, if any."""
        ...

    async def save_state(self, name: str, state: dict[str, Any]) -> bool:
        """Save it while this process holds `name` (fenced); False when it does not."""
        ...

    async def confirm(self, name: str) -> float:
        """Before each request of a polling connection: renew the hold (fenced) and say for
        how many seconds it is certain; 0: send no more requests (lost, or handing over).
        A long poll's timeout must end within that time."""
        ...


class ConnectionHolder(ConnectionStates, Protocol):
    async def hold_connection(self, name: str, run: ConnectionRun) -> None:
        """Run `run()` while this process holds connection `name`; returns only after `hand_over`."""
        ...

    async def hand_over(self, grace: float) -> None:
        """Stop every connection (a poll in flight ends first) and give its hold up (SIGTERM)."""
        ...


class LocalConnections:
    """Every connection is held here: no other replica can compete for it."""

    def __init__(self, retry_seconds: float = 1.0) -> None:
        self.retry_seconds = retry_seconds
        self._states: dict[str, dict[str, Any]] = {}
        self._closing = False

    async def load_state(self, name: str) -> dict[str, Any] | None:
        return self._states.get(name)

    async def save_state(self, name: str, state: dict[str, Any]) -> bool:
        self._states[name] = dict(state)
        return True

    async def confirm(self, name: str) -> float:
        return 0.0 if self._closing else float("inf")

    async def hand_over(self, grace: float) -> None:
        # Nobody else could take a connection over: polls end by `confirm`, sockets when
        # their adapter stops.
        self._closing = True

    async def hold_connection(self, name: str, run: ConnectionRun) -> None:
        while not self._closing:
            try:
                await run()
                log.info("connection_ended", connection=name)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("connection_failed", connection=name)
            await asyncio.sleep(self.retry_seconds)
