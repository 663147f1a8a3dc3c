"""The session bus across replicas: PostgreSQL LISTEN/NOTIFY, no other broker.

Each replica delivers its own publishes to its local subscribers directly and NOTIFYs
the other replicas on a channel derived from the session key (`cg_<sha256(key)[:40]>`,
so a replica only LISTENs to the keys somebody watches there). NOTIFY payloads are
limited to 8000 bytes: bigger events are split into chunks that the receivers put back
together (notifications of one sender arrive in order). A counter in every envelope keeps
PostgreSQL from merging equal payloads sent in one transaction.

When the listening connection drops, the bus reconnects, LISTENs again and hands every
local subscriber a `{"type": "resync"}` marker: events may have been missed, and the
gateway re-reads the history it needs from the database. Whatever connecting raises
(`BUS_ERRORS`: an OSError, any asyncpg error, `TargetServerAttributeNotMatched` while
every listed host is a standby during a failover) is retried, never fatal: with a
multi-host URL (`?host=a:5432&host=b:5432&target_session_attrs=read-write`) the bus
finds the new primary the way the pool does (`app.db.dsn`). It connects to
`BUS_DATABASE_URL` (default `DATABASE_URL`): LISTEN needs a session of its own, so
behind a pooler in transaction mode it must be a direct connection (docs/operations.md).

Most keys are watched by nobody (no browser is attached anywhere), and a NOTIFY for them
is work for nothing: three statements per answered event. So a replica that LISTENs for
a key also marks it watched in the database (`session_keys.watched_until`, renewed at
every health check, expiring after `WATCH_CHECKS` missed ones), and a turn learns from
its fenced statements whether its key is watched (`TurnHandler`, `remote=False` when
not). Marking the key and the fenced statements both write the key's row, so they are
ordered by its row lock: either the statement sees the mark (and its messages are
NOTIFYed), or the mark waits for the statement's commit, and the subscriber, which
reads the history only after marking, reads those messages from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import itertools
import json
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import asyncpg
import structlog

from app.bus import LocalSessionBus, is_session_key
from app.db.dsn import asyncpg_connect_kwargs

log = structlog.get_logger(__name__)

MAX_PAYLOAD_BYTES = 7900  # PostgreSQL's limit is 8000 with the default block size
CHUNK_CHARS = 3000  # JSON-escaping a chunk at most doubles it: still under the limit
PARTIAL_TTL_SECONDS = 60.0
MAX_PENDING_NOTIFICATIONS = 20_000
WATCH_CHECKS = 4  # a key stays marked watched for this many health checks without renewal

# Mark keys watched (created if new), in key order: two replicas renewing overlapping
# sets at once must not deadlock.
_WATCH = """
INSERT INTO session_keys (key, lease_fence, watched_until)
SELECT k, 0, now() + make_interval(secs => $2) FROM unnest($1::varchar[]) AS k ORDER BY k
ON CONFLICT (key) DO UPDATE SET watched_until = excluded.watched_until
"""


def channel_for(key: str) -> str:
    return "cg_" + hashlib.sha256(key.encode()).hexdigest()[:40]


# Everything connecting or talking to PostgreSQL may raise: asyncpg's server errors, its
# client-side errors (a closed connection), its internal ones (no listed host is the
# primary yet: `TargetServerAttributeNotMatched`), and the OS's (refused, reset, timed out).
BUS_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)


class PgSessionBus:
    def __init__(
        self,
        database_url: str,
        *,
        reconnect_delay: float = 1.0,
        check_interval: float = 15.0,
        connect_timeout: float = 10.0,
    ) -> None:
        # A bounded attempt per host: a host that does not answer at all (a partition)
        # must not hold the reconnect for asyncpg's default minute.
        self._connect_kwargs = {"timeout": connect_timeout, **asyncpg_connect_kwargs(database_url)}
        self._reconnect_delay = reconnect_delay
        self._check_interval = check_interval
        self._local = LocalSessionBus()
        self._origin = uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)
        self._watched: Counter[str] = Counter()  # key -> local subscriptions
        self._listen_conn: asyncpg.Connection | None = None
        self._listen_lock = asyncio.Lock()
        self._publish_conn: asyncpg.Connection | None = None
        self._outgoing: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        self._partial: dict[tuple[str, int], tuple[float, list[str | None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._reconnecting: asyncio.Task[None] | None = None
        self._stopping = False
        self._dropped = 0

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._stopping = False
        try:
            await self._connect_listener()
        except BUS_ERRORS as exc:
            log.warning("bus_listen_connect_failed", error=str(exc))
            self._schedule_reconnect()
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="pg-bus-publisher"))
        self._tasks.append(asyncio.create_task(self._check_loop(), name="pg-bus-check"))

    async def stop(self) -> None:
        self._stopping = True
        # Give queued notifications a moment to go out before the process leaves.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._outgoing.join(), 2.0)
        for task in [*self._tasks, self._reconnecting]:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        self._tasks.clear()
        for conn in (self._listen_conn, self._publish_conn):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(conn.close(), 2.0)
        self._listen_conn = self._publish_conn = None

    # --- SessionBus -------------------------------------------------------------------

    async def publish(self, key: str, event: dict[str, Any], *, remote: bool = True) -> None:
        """Deliver locally now; NOTIFY the other replicas in the background, in order.

        `remote=False`: no replica watched the key when the caller's fenced statement
        locked its row (see the module), so there is nobody to NOTIFY.
        """
        self._local.deliver_local(key, event)
        if not remote:
            return
        if self._outgoing.qsize() >= MAX_PENDING_NOTIFICATIONS:
            # PostgreSQL is not keeping up (or is away): drop rather than grow without
            # bound; other replicas' clients fill history holes from the database.
            self._dropped += 1
            if self._dropped % 1000 == 1:
                log.warning("bus_notify_backlog_full", dropped=self._dropped)
            return
        channel = channel_for(key)
        for payload in self._envelopes(key, event):
            self._outgoing.put_nowait((channel, payload))

    @asynccontextmanager
    async def subscribe(self, key: str, maxsize: int = 1000) -> AsyncIterator[asyncio.Queue[dict[str, Any]]]:
        # Register locally, then LISTEN: once this yields, nothing published later is missed.
        async with self._local.subscribe(key, maxsize) as queue:
            self._watched[key] += 1
            try:
                if self._watched[key] == 1:
                    await self._listen(key)
                else:
                    async with self._listen_lock:
                        pass  # a LISTEN for this key may still be on its way: wait for it
                yield queue
            finally:
                self._watched[key] -= 1
                if self._watched[key] <= 0:
                    del self._watched[key]
                    await self._unlisten(key)

    def subscriber_count(self, key: str) -> int:
        return self._local.subscriber_count(key)

    # --- envelopes --------------------------------------------------------------------

    def _envelopes(self, key: str, event: dict[str, Any]) -> list[str]:
        n = next(self._counter)
        body = json.dumps(event, separators=(",", ":"), default=str)  # ASCII: bytes == chars
        whole = json.dumps({"o": self._origin, "n": n, "k": key, "e": body}, separators=(",", ":"))
        if len(whole) <= MAX_PAYLOAD_BYTES:
            return [whole]
        pieces = [body[i : i + CHUNK_CHARS] for i in range(0, len(body), CHUNK_CHARS)]
        return [
            json.dumps(
                {"o": self._origin, "n": n, "k": key, "i": i, "t": len(pieces), "d": piece},
                separators=(",", ":"),
            )
            for i, piece in enumerate(pieces)
        ]

    def _on_notification(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        try:
            env = json.loads(payload)
            if env["o"] == self._origin:
                return  # our own publish: delivered locally already
            key = env["k"]
            if "e" in env:
                body = env["e"]
            else:
                body = self._reassemble(env)
                if body is None:
                    return
            event = json.loads(body)
        except (ValueError, KeyError, TypeError):
            log.warning("bus_bad_notification", size=len(payload))
            return
        self._local.deliver_local(key, event)

    def _reassemble(self, env: dict[str, Any]) -> str | None:
        ident = (env["o"], int(env["n"]))
        now = time.monotonic()
        _, parts = self._partial.setdefault(ident, (now, [None] * int(env["t"])))
        parts[int(env["i"])] = env["d"]
        if any(p is None for p in parts):
            if len(self._partial) > 100:  # a sender died mid-event: forget old fragments
                for old, (seen, _) in list(self._partial.items()):
                    if now - seen > PARTIAL_TTL_SECONDS:
                        del self._partial[old]
            return None
        del self._partial[ident]
        return "".join(p for p in parts if p is not None)

    # --- listening ----------------------------------------------------------------------

    async def _connect_listener(self) -> None:
        conn = await asyncpg.connect(**self._connect_kwargs)
        conn.add_termination_listener(self._on_listener_lost)
        async with self._listen_lock:
            self._listen_conn = conn
            for key in list(self._watched):
                await conn.add_listener(channel_for(key), self._on_notification)
            await self._mark_watched(conn, list(self._watched))

    async def _listen(self, key: str) -> None:
        async with self._listen_lock:
            if self._listen_conn is None or self._listen_conn.is_closed():
                return  # the reconnect will LISTEN and resync this key
            try:
                await self._listen_conn.add_listener(channel_for(key), self._on_notification)
                await self._mark_watched(self._listen_conn, [key])
            except BUS_ERRORS as exc:
                log.warning("bus_listen_failed", error=str(exc))
                self._schedule_reconnect()

    async def _mark_watched(self, conn: asyncpg.Connection, keys: list[str]) -> None:
        """Mark `keys` watched for `WATCH_CHECKS` health checks (see the module); the
        gateway's own topics are no sessions and are not marked."""
        keys = [k for k in keys if is_session_key(k)]
        if keys:
            await conn.execute(_WATCH, keys, self._check_interval * WATCH_CHECKS)

    async def _unlisten(self, key: str) -> None:
        async with self._listen_lock:
            if self._listen_conn is None or self._listen_conn.is_closed():
                return
            with contextlib.suppress(*BUS_ERRORS):
                await self._listen_conn.remove_listener(channel_for(key), self._on_notification)

    async def _check_loop(self) -> None:
        """A connection can die without telling (a partition): ask it something now and then."""
        while True:
            await asyncio.sleep(self._check_interval)
            conn = self._listen_conn
            if conn is None or (self._reconnecting is not None and not self._reconnecting.done()):
                continue
            try:
                async with self._listen_lock:
                    sessions = [k for k in self._watched if is_session_key(k)]
                    if sessions:  # renewing the marks doubles as the health check
                        await asyncio.wait_for(self._mark_watched(conn, sessions), 5.0)
                    else:
                        await asyncio.wait_for(conn.fetchval("SELECT 1"), 5.0)
            except BUS_ERRORS as exc:  # TimeoutError is an OSError
                log.warning("bus_listener_unhealthy", error=str(exc) or type(exc).__name__)
                self._schedule_reconnect()

    def _on_listener_lost(self, _conn: Any) -> None:
        if not self._stopping:
            log.warning("bus_listener_lost")
            self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        if self._stopping or (self._reconnecting is not None and not self._reconnecting.done()):
            return
        self._reconnecting = asyncio.create_task(self._reconnect(), name="pg-bus-reconnect")

    async def _reconnect(self) -> None:
        old, self._listen_conn = self._listen_conn, None
        if old is not None:
            with contextlib.suppress(Exception):
                old.terminate()
        while not self._stopping:
            try:
                await self._connect_listener()
            except Exception as exc:
                log.warning("bus_reconnect_failed", error=str(exc) or type(exc).__name__)
                await asyncio.sleep(self._reconnect_delay)
                continue
            log.info("bus_reconnected", keys=len(self._watched))
            for key in list(self._watched):
                self._local.deliver_local(key, {"type": "resync", "session_key": key})
            return

    # --- publishing ---------------------------------------------------------------------

    async def _publish_loop(self) -> None:
        while True:
            batch = [await self._outgoing.get()]
            while not self._outgoing.empty() and len(batch) < 500:
                batch.append(self._outgoing.get_nowait())
            try:
                await self._notify(batch)
            finally:
                for _ in batch:
                    self._outgoing.task_done()

    async def _notify(self, batch: list[tuple[str, str]]) -> None:
        for attempt in range(5):
            try:
                if self._publish_conn is None or self._publish_conn.is_closed():
                    self._publish_conn = await asyncpg.connect(**self._connect_kwargs)
                # One round trip: asyncpg pipelines the batch and ends it with one Sync,
                # so it runs as one implicit transaction (no BEGIN/COMMIT needed).
                await self._publish_conn.executemany("SELECT pg_notify($1, $2)", batch)
                return
            except asyncio.CancelledError:
                raise
            except BUS_ERRORS as exc:
                log.warning("bus_notify_failed", error=str(exc), attempt=attempt + 1)
                if self._publish_conn is not None:
                    with contextlib.suppress(Exception):
                        self._publish_conn.terminate()
                self._publish_conn = None
                await asyncio.sleep(min(2.0, self._reconnect_delay * (attempt + 1)))
        # Other replicas' clients notice the hole at their next message and fill it from
        # the database; only transient events (deltas) are lost.
        log.error("bus_notify_dropped", notifications=len(batch))
