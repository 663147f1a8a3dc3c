"""The database cannot be reached: which errors say so, and one log line per outage.

While PostgreSQL is away (restarting, failing over, partitioned) every statement fails
with a connection error of one kind or another: the OS's (refused, reset, timed out),
asyncpg's (the connection closed, no listed host is the primary yet, the server shutting
down), or SQLAlchemy's wrapping of them. `unreachable(exc)` tells those apart from
everything else, so the API answers 503 with `Retry-After` for them and keeps answering
500 for its own bugs. `Outage` counts what was refused and logs once when an outage
starts and once when a probe finds the database back, instead of a traceback per request.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import asyncpg
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

log = structlog.get_logger(__name__)

T = TypeVar("T")

# SQLSTATE classes and codes of a server that is not (or no longer) there to answer:
# 08 connection exceptions, 57P01-57P03 shutdown and start-up, 25006 a read-only
# transaction (a standby, or a demoted primary, answered a write).
_UNREACHABLE_SQLSTATE_CLASSES = ("08",)
_UNREACHABLE_SQLSTATES = {"57P01", "57P02", "57P03", "25006"}

_DRIVER_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,  # refused, reset, aborted
    TimeoutError,  # a connection attempt past DB_CONNECT_TIMEOUT_SECONDS
    socket.gaierror,  # a host name that does not resolve
    asyncpg.InterfaceError,  # the connection is closed / was lost mid-statement
    asyncpg.InternalClientError,  # TargetServerAttributeNotMatched: no primary among the hosts
    asyncpg.CannotConnectNowError,
    asyncpg.PostgresConnectionError,
)


def unreachable(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) says the database cannot be reached right now."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, sa_exc.DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, sa_exc.TimeoutError):  # no pooled connection came free
            return True
        if isinstance(current, _DRIVER_ERRORS):
            return True
        code = getattr(current, "sqlstate", None)
        if isinstance(code, str) and (
            code in _UNREACHABLE_SQLSTATES or code.startswith(_UNREACHABLE_SQLSTATE_CLASSES)
        ):
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else (current.__cause__ or current.__context__)
    return False


class Outage:
    """Refused requests while the database is away, and the two log lines of an outage.

    `refused(exc)` is called for every request answered 503; the first one of an outage
    logs `database_unreachable` and starts a probe that asks the database every
    `probe_seconds`; when it answers, `database_reachable_again` is logged with how
    many requests were refused and for how long. Nothing waits on the probe: requests
    keep trying the database, so recovery needs nothing but the database.
    """

    def __init__(self, engine: AsyncEngine, *, retry_after: int, probe_seconds: float = 1.0) -> None:
        self.engine = engine
        self.retry_after = retry_after
        self.probe_seconds = probe_seconds
        self.count = 0
        self._since: float | None = None
        self._probe: asyncio.Task[None] | None = None

    @property
    def ongoing(self) -> bool:
        return self._since is not None

    def refused(self, exc: BaseException) -> None:
        self.count += 1
        if self._since is not None:
            return
        self._since = time.monotonic()
        log.warning(
            "database_unreachable",
            error=_first_line(exc),
            error_type=type(exc).__name__,
            retry_after=self.retry_after,
        )
        self._probe = asyncio.create_task(self._wait_until_back(), name="database-outage-probe")

    async def _wait_until_back(self) -> None:
        while True:
            await asyncio.sleep(self.probe_seconds)
            try:
                async with self.engine.connect() as conn:
                    await conn.execute(text("SELECT 1"))
            except Exception:
                continue
            since, self._since = self._since, None
            log.warning(  # at the level of the outage's first line, so both are seen
                "database_reachable_again",
                refused_requests=self.count,
                seconds=round(time.monotonic() - (since or time.monotonic()), 1),
            )
            self.count = 0
            return

    async def aclose(self) -> None:
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe


LOOP_LOG_EVERY_SECONDS = 30.0
# When each background event was last logged as "database away". Process-wide on purpose:
# it only thins out log lines, and every loop of the process shares the one database.
_last_logged: dict[str, float] = {}


def log_failure(logger: Any, event: str, exc: BaseException, **kw: Any) -> None:
    """A background loop's failure (it tries again by itself). The database away: one
    line without a traceback, at most every `LOOP_LOG_EVERY_SECONDS` per event name, not
    one traceback per poll. Anything else: the traceback, as before."""
    if not unreachable(exc):
        logger.exception(event, **kw)
        return
    now = time.monotonic()
    if now - _last_logged.get(event, -LOOP_LOG_EVERY_SECONDS) >= LOOP_LOG_EVERY_SECONDS:
        _last_logged[event] = now
        logger.warning(event, database="unreachable", error=_first_line(exc), **kw)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


def shielded(work: Awaitable[T]) -> asyncio.Future[T]:
    """`asyncio.shield(work)` whose work, left going when the caller is cancelled, still
    has its failure seen: `shield` stops watching the inner task once the outer future is
    cancelled, and a statement that then failed (the database went away mid-read) ended
    as asyncio's "Task exception was never retrieved" with a traceback. Logged here as a
    background loop's failure is (one line while the database is away)."""
    inner = asyncio.ensure_future(work)
    outer = asyncio.shield(inner)

    def _seen(task: asyncio.Future[T]) -> None:
        if task.cancelled():
            return
        exc = task.exception()  # retrieved: asyncio does not report it again
        if exc is not None and outer.cancelled():
            name = getattr(task.get_coro(), "__qualname__", "?") if isinstance(task, asyncio.Task) else "?"
            log_failure(log, "shielded_work_failed", exc, work=name)

    inner.add_done_callback(_seen)
    return outer
