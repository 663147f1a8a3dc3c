"""One worker per busy session key, holding the key's lease while it drains.

Events of one key are handled one turn at a time in inbox order; different keys run in
parallel, bounded by a semaphore. A poller picks up keys whose events were accepted by
another replica or left behind by a dead worker once its lease expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.direct import Direct
from app.db.models import utcnow
from app.errors import LeaseLost
from app.events import BusyPolicy, InboundEvent
from app.pipeline import fused, prefetch
from app.pipeline.accept_start import ACCEPT_STARTING
from app.pipeline.inbox import Claim, Inbox, InboxRow
from app.pipeline.replies import is_command
from app.pipeline.slots import RunSlots
from app.pipeline.turn import TurnHandler
from app.sessions import lease as leases

log = structlog.get_logger(__name__)


class Dispatcher:
    def __init__(
        self,
        engine: AsyncEngine,
        inbox: Inbox,
        handler: TurnHandler,
        *,
        owner: str,
        lease_ttl: float,
        max_concurrent_runs: int,
        poll_interval: float,
        busy_policies: Mapping[str, BusyPolicy] | None = None,
        collect_debounce: float = 0.5,
        on_takeover: Callable[[], None] | None = None,
        approval_sweep: float = 5.0,
    ) -> None:
        self.engine = engine
        self.inbox = inbox
        self.handler = handler
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.busy_policies = dict(busy_policies or {})
        self.on_takeover = on_takeover
        self.collect_debounce = collect_debounce
        self.approval_sweep = approval_sweep
        self.max_concurrent_runs = max_concurrent_runs
        self._runs: RunSlots[Claim] = RunSlots(max_concurrent_runs)
        self._handed_on: set[str] = set()  # keys whose worker handed its run slot on
        self._room = asyncio.Event()  # a worker ended while fewer keys than run slots had one
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._reserved: set[str] = set()  # keys with a run slot, their event being accepted
        self._again: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._stopping = False
        # PostgreSQL: taking a lease and ending a turn read the key's next rows too.
        self._prefetch = engine.dialect.name == "postgresql"

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._poller = asyncio.create_task(self._poll_loop(), name="dispatcher-poller")

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in [self._poller, *self._workers.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    @property
    def busy_keys(self) -> list[str]:
        return list(self._workers)

    # --- scheduling -----------------------------------------------------------------

    def notify(self, key: str) -> None:
        """An event for `key` was accepted: make sure some worker will drain it."""
        if self._stopping:
            return
        if key in self._workers or key in self._reserved:
            self._again.add(key)
            # A running turn looks for /stop (and `steer` input) as soon as it can.
            self.handler.input_arrived(key)
            return
        self._workers[key] = asyncio.create_task(self._drain(key), name=f"drain:{key}")

    # --- taking a lease with the event that needs it (Inbox.claimer, PostgreSQL) ---------

    rows_limit = prefetch.LIMIT

    def accept_statement(self, *, dedup: bool, plan: fused.StartPlan | None) -> Direct:
        if plan is None:
            return prefetch.ACCEPT_TAKING[dedup]
        return ACCEPT_STARTING[dedup, plan.recall]

    def start_plan(self, event: InboundEvent, now: datetime) -> fused.StartPlan | None:
        # A `collect` key's turn may take more events than this one: it starts after them.
        if self.busy_policies.get(event.channel, BusyPolicy.QUEUE) is BusyPolicy.COLLECT:
            return None
        return self.handler.start_plan(event, now)

    def reserve(self, key: str) -> bool:
        if self._stopping or key in self._workers or key in self._reserved or not self._runs.try_take():
            return False
        self._reserved.add(key)
        return True

    def taken(self, key: str, lease: leases.SessionLease, rows: list[InboxRow] | None) -> None:
        self._reserved.discard(key)
        self._workers[key] = asyncio.create_task(self._drain(key, (lease, rows)), name=f"drain:{key}")

    def unreserve(self, key: str) -> None:
        self._reserved.discard(key)
        self._runs.release()

    async def _poll_loop(self) -> None:
        """Take keys nobody is working on: other replicas' events, a dead worker's leftovers.

        Only as many as this replica has free run slots (at least one, the longest
        waiting): keys taken beyond that would only queue here, and another replica with
        room, or the one that accepted them, would find them already claimed and
        compete for their leases. When a poll filled the free slots, the next one comes
        as soon as a slot frees up (a backlog after a restart is not held to one slot's
        worth a poll interval).
        """
        loop = asyncio.get_running_loop()
        next_sweep = loop.time()
        while True:
            full = False
            self._room.clear()
            try:
                if loop.time() >= next_sweep:
                    # Timed-out approvals become `/deny` events of their session, handled
                    # in order under the key's lease like any other event.
                    next_sweep = loop.time() + self.approval_sweep
                    await self.handler.enqueue_expired_approvals()
                room = max(1, self.max_concurrent_runs - len(self._workers))
                keys = await self.inbox.claimable_keys(limit=room)
                for key in keys:
                    self.notify(key)
                full = len(keys) == room
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("inbox_poll_failed")
            interval = min(self.poll_interval, self.approval_sweep)
            if not full:
                await asyncio.sleep(interval)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(interval):
                    await self._room.wait()

    async def _drain(self, key: str, claim: Claim | None = None) -> None:
        try:
            while True:
                self._again.discard(key)
                more, claim = await self._drain_once(key, claim), None
                # An event accepted while we released the lease found it still held and
                # relied on us: the release told whether any is left.
                if self._stopping or not (more or key in self._again):
                    break
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("drain_failed", session_key=key)
        finally:
            self._workers.pop(key, None)
            if len(self._workers) < self.max_concurrent_runs:
                self._room.set()

    async def _drain_once(self, key: str, claim: Claim | None = None) -> bool:
        """Hold the key's lease while it has events; returns whether some are left.

        The run slot is taken before the lease: a key waiting for a slot holds no lease
        (nothing to renew, and another replica with a free slot may take the key). A
        `claim` (lease and rows taken on accept) comes with its slot reserved already; a
        slot handed on by another key's worker may come with one too (`_Handoff`).
        """
        if claim is None:
            claim = await self._runs.take(key)
        try:
            return await self._drain_leased(key, claim)
        finally:
            if key in self._handed_on:
                self._handed_on.discard(key)
            else:
                self._runs.release()

    async def _acquire(self, key: str) -> tuple[leases.SessionLease | None, list[InboxRow] | None]:
        """The key's lease, and its next rows when the taking statement could read them."""
        if self._prefetch:
            return await prefetch.acquire(self.engine, key, self.owner, self.lease_ttl)
        return await leases.acquire(self.engine, key, self.owner, self.lease_ttl), None

    async def _drain_leased(self, key: str, claim: Claim | None = None) -> bool:
        lease, known = claim if claim is not None else await self._acquire(key)
        if lease is None:
            return False  # its holder looks for new events when it releases the key
        if lease.took_over and self.on_takeover is not None:
            log.info("lease_taken_over_from_expired_owner", session_key=key, fence=lease.fence)
            self.on_takeover()
        worker = asyncio.current_task()
        assert worker is not None
        released = asyncio.Event()  # a turn's end released the lease: the renewer must not mind
        renewer = asyncio.create_task(self._renew(lease, worker, released))
        structlog.contextvars.bind_contextvars(session_key=key)
        try:
            if lease.fence > 1:
                log.debug("lease_acquired", fence=lease.fence)
            while not self._stopping:
                self._again.discard(key)
                batch, more = await self._next_batch(key, known)
                if not batch:
                    break
                structlog.contextvars.bind_contextvars(channel=batch[-1].channel, event_id=batch[-1].event_id)
                handoff = _Handoff(self, key) if self._prefetch else None
                try:
                    try:
                        handled = await self.handler.handle(lease, batch, handoff=handoff)
                    finally:
                        if handoff is not None:
                            handoff.close()
                    known = handled.upcoming
                except LeaseLost:
                    raise
                except Exception:
                    log.exception("turn_failed")
                    await asyncio.sleep(0.2)  # the rows stay unfinished: retried, then failed
                    known, more = None, True
                else:
                    if handled.released:
                        # The key had no rows left; events accepted here since are in
                        # `_again` (the drain takes the lease anew), other replicas' take
                        # it themselves.
                        released.set()
                        break
                if known is not None:  # read at the turn's end: newer than `more`
                    more = bool(known)
                # Events accepted here meanwhile are in `_again`; events accepted by other
                # replicas are found by the release.
                if not (more or key in self._again):
                    break
                if not known:
                    known = None  # `_again`: rows accepted after the turn's end read them
        except LeaseLost:
            log.warning("lease_lost", fence=lease.fence)
            return False
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            structlog.contextvars.unbind_contextvars("session_key", "channel", "event_id")
            self.handler.store.release(key)  # cached state is only valid under this lease
        if released.is_set():
            return False
        return await leases.release(self.engine, lease)

    async def _next_batch(self, key: str, known: list[InboxRow] | None) -> tuple[list[InboxRow], bool]:
        """The next turn's rows, and whether more rows were waiting behind them.

        `known`: the key's next rows as the statement before read them (`prefetch`), or None.
        """
        rows = known if known is not None else await self.inbox.next_rows(key, limit=prefetch.LIMIT)
        if not rows:
            return [], False
        policy = self.busy_policies.get(rows[0].channel, BusyPolicy.QUEUE)
        if policy is not BusyPolicy.COLLECT or is_command(rows[0].event):
            return rows[:1], len(rows) > 1
        await asyncio.sleep(self.collect_debounce)
        rows = await self.inbox.next_rows(key, limit=101)
        # Never merge across channels (a reply goes back to one place), and never merge
        # a command (/stop, /approve …) into a message turn: it is handled on its own.
        batch = list(
            itertools.takewhile(
                lambda r: r.channel == rows[0].channel and not is_command(r.event), rows[:100]
            )
        )
        batch = batch or rows[:1]
        return batch, len(rows) > len(batch)

    async def _renew(
        self, lease: leases.SessionLease, worker: asyncio.Task[None], released: asyncio.Event
    ) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                # Cancelled when the drain ends, maybe mid-statement: shielded, the renewal
                # finishes and returns its pooled connection regardless.
                held = await asyncio.shield(leases.renew(self.engine, lease, self.lease_ttl))
            except Exception:
                log.exception("lease_renew_failed")
                continue
            if not held:
                # A turn's end may have released it, its worker about to notice: no
                # takeover then. (A real takeover loses nothing by the wait: writes under
                # the old fence fail.)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await released.wait()
                        return
                log.warning("lease_taken_over", fence=lease.fence)
                worker.cancel()  # stop the model call early; writes would fail anyway
                return


class _Handoff:
    """A worker's run slot for the next key in line, if its turn's end releases the lease.

    (`turn.Handoff`.) The releasing statement also takes the picked key's lease: the slot
    goes to that key with its lease and next rows, and its drain starts without taking
    the lease itself. When our lease was not released the key stays first in line; when
    its lease was held, it gets the slot and takes the lease as usual.
    """

    def __init__(self, dispatcher: Dispatcher, key: str) -> None:
        self.dispatcher = dispatcher
        self.key = key  # the worker's own
        self._picked: str | None = None

    def pick(self) -> fused.Successor | None:
        if self.dispatcher._stopping:
            return None
        self._picked = self.dispatcher._runs.pick()
        if self._picked is None:
            return None
        return fused.Successor(self._picked, utcnow() + timedelta(seconds=self.dispatcher.lease_ttl))

    def took(self, finished: fused.Finished) -> None:
        picked, self._picked = self._picked, None
        if picked is None:
            return
        runs = self.dispatcher._runs
        if not finished.released:
            runs.put_back(picked)
            return
        claim = None if finished.successor is None else (finished.successor, finished.successor_rows)
        self.dispatcher._handed_on.add(self.key)
        runs.hand(picked, claim)

    def close(self) -> None:
        """After the turn: a key picked for a statement that failed goes back in line."""
        if self._picked is not None:
            self.dispatcher._runs.put_back(self._picked)
            self._picked = None
