"""One holder per long-lived platform connection across replicas: fenced leases in the database.

`DatabaseConnections` is the `ConnectionHolder` of a runtime whose database may be shared
by several replicas. For each connection name (`telegram:<fingerprint>`,
`discord:<fingerprint>` …) the table `connection_leases` has one row: the owner, a fence
(incremented each time the hold changes hands, or is taken again), and an expiry.

- Taking: one statement takes a free lease, or our own; an expired lease of another
  owner is taken over by a second statement (`takeovers` counts those).
- Holding: the holder renews every `ttl / 3` with `UPDATE … WHERE owner = me AND fence =
  mine`. A renewal that matches no row means the hold was lost (another replica took it
  after this one stalled): `run()` is cancelled at once. A renewal that cannot reach the
  database is retried; once `ttl` has passed since the last renewal that succeeded,
  `run()` is cancelled too, because another replica may now take the connection.
- Giving up: when `run()` returns or fails, or the holder is cancelled (shutdown), the
  lease is released so another replica takes it without waiting for the expiry.
- Polling (Telegram `getUpdates`): a connection that is a series of requests calls
  `confirm(name)` before each one: a fenced renewal that says for how long the hold is
  certain, so the request's long-poll timeout ends before another replica could take the
  connection. Two holders' polls can then never be in flight together: not after an
  expiry (the old poll ended before it), not after a hand-over (below).
- Handing over (`hand_over`, SIGTERM): `confirm` answers 0 from then on, so a polling
  connection ends after the request in flight (its server may keep a cancelled long poll
  open: cancelling it is no stop); a socket connection is closed at once. Then each lease
  is released with its state saved, and nothing here seeks a hold again.

A connection hands what it receives to `ChannelContext.accept` (the inbox, deduplicated
on the platform's ids), and platforms redeliver what was not acknowledged: an event seen
by both the old and the new holder around a takeover is stored once.

The row also keeps a holder's `state` (`save_state`, fenced like a renewal) for the next
holder (`load_state`): the Discord Gateway's session id, resume URL and last sequence,
so a takeover RESUMEs and the platform replays what came during the gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.connections import ConnectionRun
from app.db.engine import autocommit
from app.db.models import connection_leases, utcnow
from app.db.upsert import insert_for

log = structlog.get_logger(__name__)

_C = connection_leases.c
_MINE = and_(_C.name == bindparam("n"), _C.owner == bindparam("o"), _C.fence == bindparam("f"))
_TAKE_EXPIRED = (
    update(connection_leases)
    .where(_C.name == bindparam("n"), _C.owner != bindparam("o"), _C.expires_at < bindparam("now"))
    .values(
        owner=bindparam("o"),
        fence=_C.fence + 1,
        expires_at=bindparam("exp"),
        acquired_at=bindparam("now"),
        takeovers=_C.takeovers + 1,
    )
    .returning(_C.fence)
)
_RENEW = update(connection_leases).where(_MINE).values(expires_at=bindparam("exp"))
_RELEASE = update(connection_leases).where(_MINE).values(owner=None, expires_at=None)
_SAVE_STATE = update(connection_leases).where(_MINE).values(state=bindparam("state"))


def _take_free_or_own(dialect_name: str) -> Any:
    owner: Any = bindparam("o")
    values: dict[str, Any] = {"expires_at": bindparam("exp"), "acquired_at": bindparam("now")}
    return (
        insert_for(dialect_name, connection_leases)
        .values(name=bindparam("n"), owner=owner, fence=1, takeovers=0, **values)
        .on_conflict_do_update(
            index_elements=["name"],
            set_={"owner": owner, "fence": _C.fence + 1, **values},
            where=or_(_C.owner.is_(None), _C.owner == owner),
        )
        .returning(_C.fence)
    )


_TAKE = {name: _take_free_or_own(name) for name in ("postgresql", "sqlite")}


@dataclass(frozen=True)
class ConnectionLease:
    name: str
    owner: str
    fence: int
    took_over: bool = False  # taken from another owner whose lease had expired


@dataclass(frozen=True)
class ConnectionHold:
    """One row of `connection_leases`, as the admin API shows it."""

    name: str
    owner: str | None
    fence: int
    expires_at: datetime | None
    acquired_at: datetime | None
    takeovers: int

    def held(self, now: datetime) -> bool:
        return self.owner is not None and self.expires_at is not None and self.expires_at >= now


async def acquire(engine: AsyncEngine, name: str, owner: str, ttl: float) -> ConnectionLease | None:
    """Take the lease of connection `name` if it is free, expired or ours; None if held."""
    now = utcnow()
    params = {"n": name, "o": owner, "now": now, "exp": now + timedelta(seconds=ttl)}
    async with autocommit(engine).connect() as conn:
        fence = (await conn.execute(_TAKE[conn.dialect.name], params)).scalar()
        if fence is not None:
            return ConnectionLease(name, owner, fence)
        fence = (await conn.execute(_TAKE_EXPIRED, params)).scalar()
    return ConnectionLease(name, owner, fence, took_over=True) if fence is not None else None


def _mine(lease: ConnectionLease) -> dict[str, Any]:
    return {"n": lease.name, "o": lease.owner, "f": lease.fence}


async def renew(engine: AsyncEngine, lease: ConnectionLease, ttl: float) -> bool:
    """Extend the hold; False when it is no longer ours (the fence moved on)."""
    async with autocommit(engine).connect() as conn:
        result = await conn.execute(_RENEW, {**_mine(lease), "exp": utcnow() + timedelta(seconds=ttl)})
    return result.rowcount == 1


async def release(engine: AsyncEngine, lease: ConnectionLease) -> None:
    async with autocommit(engine).connect() as conn:
        await conn.execute(_RELEASE, _mine(lease))


async def list_holds(engine: AsyncEngine) -> list[ConnectionHold]:
    """Every connection lease ever taken, by name."""
    async with engine.connect() as conn:
        shown = [c for c in connection_leases.c if c.name != "state"]  # kept for the holder only
        rows = (await conn.execute(select(*shown).order_by(_C.name))).mappings().all()
    return [ConnectionHold(**dict(row)) for row in rows]


class DatabaseConnections:
    """`ConnectionHolder` across replicas sharing one database (`app.connections`)."""

    def __init__(
        self,
        engine: AsyncEngine,
        owner: str,
        *,
        ttl: float = 30.0,
        retry_seconds: float | None = None,
        on_change: Callable[[str, bool], None] | None = None,
        on_takeover: Callable[[str], None] | None = None,
    ) -> None:
        self.engine = engine
        self.owner = owner
        self.ttl = ttl
        self.renew_every = ttl / 3
        # A released connection is sought again within a second: a hand-over is taken at once.
        self.retry_seconds = retry_seconds if retry_seconds is not None else min(ttl / 3, 1.0)
        self._on_change = on_change
        self._on_takeover = on_takeover
        self.held: dict[str, ConnectionLease] = {}  # the connections this process holds now
        self._closing = False
        self._runs: dict[str, asyncio.Future[None]] = {}  # each held connection's run()
        self._polling: set[str] = set()  # connections that `confirm` before each request
        self._confirmed: dict[str, float] = {}  # monotonic time of each hold's last confirmation
        self._holds = 0  # hold_connection calls still running
        self._idle = asyncio.Event()  # set when none is
        self._idle.set()

    async def hold_connection(self, name: str, run: ConnectionRun) -> None:
        """Run `run()` while this process holds `name`; returns only after `hand_over`."""
        self._holds += 1
        self._idle.clear()
        try:
            while not self._closing:
                lease = await self._wait_for_lease(name)
                if lease is None:
                    return
                try:
                    await self._run_while_held(lease, run)
                finally:
                    await self._let_go(lease)
                if self._closing:
                    return
                await asyncio.sleep(self.retry_seconds)
        finally:
            self._holds -= 1
            if self._holds == 0:
                self._idle.set()

    async def confirm(self, name: str) -> float:
        """Renew the hold of `name` (fenced) before a request; seconds it is certain for.

        0 when this process does not hold it, lost it, or is handing over: then the
        connection must not send another request.
        """
        self._polling.add(name)
        lease = self.held.get(name)
        if lease is None or self._closing:
            return 0.0
        asked = time.monotonic()
        try:
            still_ours = await asyncio.wait_for(renew(self.engine, lease, self.ttl), self.renew_every)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning("connection_lease_renew_failed", connection=name, error=repr(exc))
            still_ours = False
        if not still_ours or self._closing:
            return 0.0
        self._confirmed[name] = asked
        # Clocks of replicas differ a little, and the request needs time to arrive: a margin.
        return max(0.0, self.ttl - (time.monotonic() - asked) - min(1.0, self.ttl / 10))

    async def hand_over(self, grace: float) -> None:
        """Stop every connection and give its lease up (see the module); within `grace`."""
        self._closing = True
        for name, task in list(self._runs.items()):
            if name not in self._polling:  # a socket: closed now; the next holder reconnects
                task.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace):
                await self._idle.wait()
                return
        for task in list(self._runs.values()):  # a request that outlasted the grace
            task.cancel()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5.0):
                await self._idle.wait()

    async def load_state(self, name: str) -> dict[str, Any] | None:
        async with self.engine.connect() as conn:
            state = (await conn.execute(select(_C.state).where(_C.name == name))).scalar()
        return dict(state) if isinstance(state, dict) else None

    async def save_state(self, name: str, state: dict[str, Any]) -> bool:
        """Fenced by the lease this process holds: a holder that lost it writes nothing."""
        lease = self.held.get(name)
        if lease is None:
            return False
        async with autocommit(self.engine).connect() as conn:
            saved = await conn.execute(_SAVE_STATE, {**_mine(lease), "state": state})
        return saved.rowcount == 1

    async def _wait_for_lease(self, name: str) -> ConnectionLease | None:
        while not self._closing:
            acquiring = asyncio.ensure_future(acquire(self.engine, name, self.owner, self.ttl))
            try:
                lease = await asyncio.shield(acquiring)
            except asyncio.CancelledError:
                # Stopped while the statement ran: it may have taken the lease all the same.
                # Give it back before going, or it would stay ours until the TTL.
                with contextlib.suppress(Exception):
                    taken = await asyncio.shield(acquiring)
                    if taken is not None:
                        await asyncio.shield(release(self.engine, taken))
                raise
            except Exception as exc:  # the database is away: keep asking
                log.warning("connection_lease_unavailable", connection=name, error=repr(exc))
                lease = None
            if lease is not None:
                self.held[name] = lease
                if self._on_change is not None:
                    self._on_change(name, True)
                if lease.took_over and self._on_takeover is not None:
                    self._on_takeover(name)
                log.info(
                    "connection_held",
                    connection=name,
                    owner=self.owner,
                    fence=lease.fence,
                    took_over=lease.took_over,
                )
                return lease
            await asyncio.sleep(self.retry_seconds)
        return None

    async def _run_while_held(self, lease: ConnectionLease, run: ConnectionRun) -> None:
        task = asyncio.ensure_future(run())
        self._runs[lease.name] = task
        try:
            await self._renew_until_done(lease, task)
        finally:
            self._runs.pop(lease.name, None)
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("connection_failed", connection=lease.name, exc_info=task.exception())
        else:
            log.info("connection_ended", connection=lease.name)

    async def _renew_until_done(self, lease: ConnectionLease, task: asyncio.Future[None]) -> None:
        """Return when `task` ends or the hold is lost (then `task` is cancelled by the caller).

        The hold is certain until the last confirmed renewal plus `ttl` (less a margin for
        clocks): `run()` is stopped by then even while the database does not answer, so it
        never runs beside a replica that took the expired lease over.
        """
        margin = min(1.0, self.ttl / 10)
        self._confirmed[lease.name] = time.monotonic()
        try:
            while True:
                confirmed = self._confirmed[lease.name]
                left = confirmed + self.ttl - margin - time.monotonic()
                if left <= 0:
                    log.error("connection_lease_expired", connection=lease.name)
                    return
                done, _ = await asyncio.wait({task}, timeout=min(self.renew_every, left))
                if done:
                    return
                if time.monotonic() - self._confirmed[lease.name] < self.renew_every:
                    continue  # `confirm` renewed it meanwhile
                asked = time.monotonic()
                try:
                    still_ours = await asyncio.wait_for(
                        renew(self.engine, lease, self.ttl), min(self.renew_every, max(left, 0.01))
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("connection_lease_renew_failed", connection=lease.name, error=repr(exc))
                    continue
                if not still_ours:
                    log.error("connection_lost", connection=lease.name, owner=self.owner, fence=lease.fence)
                    return
                self._confirmed[lease.name] = max(self._confirmed[lease.name], asked)
        finally:
            self._confirmed.pop(lease.name, None)

    async def _let_go(self, lease: ConnectionLease) -> None:
        if self.held.get(lease.name) == lease:
            del self.held[lease.name]
            if self._on_change is not None:
                self._on_change(lease.name, False)
        # Shielded: a shutdown cancelling the holder still frees the connection for a peer,
        # and the holder ends only once it is free (whoever looks next sees it released).
        releasing = asyncio.ensure_future(release(self.engine, lease))
        try:
            await asyncio.shield(releasing)
        except asyncio.CancelledError:
            with contextlib.suppress(Exception):
                await asyncio.shield(releasing)
            raise
        except Exception:  # the database is away: the lease expires by itself
            pass
