"""Scheduling: one worker per busy session key, holding the key's lease while it drains.

Events of one key are handled one turn at a time in inbox order; different keys run in
parallel, bounded by run slots (`slots`). A worker takes its run slot first, then the
key's lease (a key waiting for a slot holds no lease: another replica with a free slot
may take it), renews the lease while it works, and gives it up when the key has nothing
left. A poller picks up keys whose events were accepted by another replica, or left
behind by a dead worker once its lease expired.

Ingest hands events to the scheduler (`accepted`); when this process has a free slot for
an idle key it may ask the store to take the key's lease with the event (`offer`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import structlog

from app.channel import AcceptResult
from app.db.outage import log_failure, shielded
from app.errors import LeaseLost
from app.pipeline.handling import Handler
from app.pipeline.midrun import MidRun
from app.pipeline.slots import RunSlots, Slot
from app.pipeline.storage.port import Claim, InboxRow, PipelineStore
from app.pipeline.turn_state import Handled
from app.sessions.lease import SessionLease

log = structlog.get_logger(__name__)

# How many of a key's next rows a worker reads at a time.
ROWS_AT_ONCE = 2
# How many of a dead replica's keys one poll frees at most (`PipelineStore.reclaim_expired`).
RECLAIM_AT_ONCE = 10_000


class Scheduler:
    def __init__(
        self,
        store: PipelineStore,
        handler: Handler,
        midrun: MidRun,
        *,
        owner: str,
        lease_ttl: float,
        max_concurrent_runs: int,
        poll_interval: float,
        on_takeover: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.handler = handler
        self.midrun = midrun
        self.owner = owner
        self.lease_ttl = lease_ttl
        self.poll_interval = poll_interval
        self.on_takeover = on_takeover
        self.max_concurrent_runs = max_concurrent_runs
        self._slots = RunSlots(max_concurrent_runs)
        self._room = asyncio.Event()  # a worker ended while fewer keys than run slots had one
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._offered: dict[str, Slot] = {}  # slots reserved for keys whose event is being stored
        self._again: set[str] = set()
        self._poller: asyncio.Task[None] | None = None
        self._stopping = False
        # Leases of workers cancelled by `hand_over` mid-turn: given up there, not left to expire.
        self._abandoned: list[SessionLease] = []

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        self._poller = asyncio.create_task(self._poll_loop(), name="scheduler-poller")

    async def stop(self) -> None:
        self._stopping = True
        tasks = [t for t in [self._poller, *self._workers.values()] if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def hand_over(self, grace: float) -> int:
        """Stop taking keys, let turns in flight finish within `grace`, give every lease up.

        A worker ends after its current turn and releases its key's lease (the key's later
        events are left to other replicas, which take the free lease at once). A turn still
        running after `grace` is cancelled: its history is legal at any point (messages are
        appended as they happen) and its attempt was counted, so the replica that takes the
        key over runs the event again. Returns how many turns were cancelled.
        """
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._poller
        workers = list(self._workers.values())
        pending: set[asyncio.Task[None]] = set()
        if workers:
            _, pending = await asyncio.wait(workers, timeout=grace)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        abandoned, self._abandoned = self._abandoned, []
        for lease in abandoned:
            try:
                await asyncio.shield(self.store.release(lease))
            except Exception:
                log.exception("lease_release_failed", session_key=lease.key)
        return len(pending)

    @property
    def busy_keys(self) -> list[str]:
        return list(self._workers)

    # --- what ingest hands over -----------------------------------------------------

    def offer(self, key: str) -> str | None:
        """An owner for the store to take `key`'s lease for with its event, if this process
        has a free run slot and no worker for the key (the slot is kept for it)."""
        if self._stopping or key in self._workers or key in self._offered:
            return None
        slot = self._slots.try_take(key)
        if slot is None:
            return None
        self._offered[key] = slot
        return self.owner

    def accepted(self, results: Sequence[AcceptResult], claim: Claim | None = None) -> None:
        """Events were stored: make sure some worker drains their keys.

        `claim`: the lease the store took with the event, for the slot `offer` kept.
        """
        for result in results:
            slot = self._offered.pop(result.session_key, None)
            if slot is not None and claim is not None and claim.lease.key == result.session_key:
                slot.claim = claim
                self._workers[result.session_key] = asyncio.create_task(
                    self._drain(result.session_key, slot), name=f"drain:{result.session_key}"
                )
                continue
            if slot is not None:
                slot.release()
            if not result.duplicate and not result.skipped:
                self.notify(result.session_key)

    def withdraw(self, key: str) -> None:
        """The event `offer` was for was not stored (its accept failed): give the slot back."""
        slot = self._offered.pop(key, None)
        if slot is not None:
            slot.release()

    def notify(self, key: str) -> None:
        """An event for `key` was accepted: make sure some worker will drain it."""
        if self._stopping:
            return
        if key in self._workers:
            self._again.add(key)
            # A running turn looks for /stop (and `steer` input) as soon as it can.
            self.midrun.input_arrived(key)
            return
        self._workers[key] = asyncio.create_task(self._drain(key), name=f"drain:{key}")

    # --- the poller -----------------------------------------------------------------

    async def _poll_loop(self) -> None:
        """Take keys nobody is working on: other replicas' events, a dead worker's leftovers.

        Only as many as this replica has free run slots (at least one, the longest
        waiting): keys taken beyond that would only queue here, and another replica with
        room, or the one that accepted them, would find them already claimed and compete
        for their leases. When a poll filled the free slots, the next one comes as soon as
        a slot frees up.
        """
        while True:
            full = False
            self._room.clear()
            try:
                reclaimed = await self._reclaim()
                room = max(1, self.max_concurrent_runs - len(self._workers))
                keys = await self.store.claimable_keys(room)
                for key in keys:
                    if key not in reclaimed:  # queued already: no second round for it
                        self.notify(key)
                full = len(keys) == room
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log_failure(log, "inbox_poll_failed", exc)
            if not full:
                await asyncio.sleep(self.poll_interval)
                continue
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.poll_interval):
                    await self._room.wait()

    async def _reclaim(self) -> set[str]:
        """Free all of a dead replica's expired leases at once and queue their keys here.

        Queued keys wait for a run slot holding no lease: a replica with room takes them
        first, then ours finds them held and moves on.
        """
        keys = await self.store.reclaim_expired(RECLAIM_AT_ONCE)
        if keys:
            log.info("expired_leases_reclaimed", count=len(keys))
        for key in keys:
            if self.on_takeover is not None:
                self.on_takeover()
            self.notify(key)
        return set(keys)

    # --- a key's worker -------------------------------------------------------------

    async def _drain(self, key: str, slot: Slot | None = None) -> None:
        try:
            while True:
                self._again.discard(key)
                more = await self._drain_once(key, slot)
                slot = None
                # An event accepted while we released the lease found it still held and
                # relied on us: the release told whether any is left.
                if self._stopping or not (more or key in self._again):
                    break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log_failure(log, "drain_failed", exc, session_key=key)
        finally:
            self._workers.pop(key, None)
            if len(self._workers) < self.max_concurrent_runs:
                self._room.set()

    async def _drain_once(self, key: str, slot: Slot | None) -> bool:
        """Hold the key's lease while it has events; returns whether some are left."""
        if slot is None:
            slot = await self._slots.take(key)
        try:
            if self._stopping and slot.claim is None:
                return False  # handing over: the key is left free for another replica
            claim = slot.claim or await self.store.take(key, self.owner)
            if claim is None:
                return False  # its holder looks for new events when it gives the key up
            return await self._drain_leased(claim, slot)
        finally:
            slot.release()

    async def _drain_leased(self, claim: Claim, slot: Slot) -> bool:
        lease, rows = claim.lease, claim.rows
        key = lease.key
        if lease.took_over and self.on_takeover is not None:
            log.info("lease_taken_over_from_expired_owner", session_key=key, fence=lease.fence)
            self.on_takeover()
        worker = asyncio.current_task()
        assert worker is not None
        released = asyncio.Event()  # a turn's end gave the lease up: the renewer must not mind
        renewer = asyncio.create_task(self._renew(lease, worker, released))
        structlog.contextvars.bind_contextvars(session_key=key)
        try:
            while not self._stopping:
                self._again.discard(key)
                if rows is None:
                    rows = await self.store.next_rows(key, ROWS_AT_ONCE)
                if not rows:
                    break
                handled = await self._handle(lease, rows, slot)
                if handled is None:
                    rows = None  # failed: the rows stay unfinished, retried, then failed
                    continue
                if handled.released:
                    # The key had no rows left; events accepted here since are in `_again`
                    # (the drain takes the lease anew), other replicas' take it themselves.
                    released.set()
                    break
                rows = handled.upcoming or None  # read at the turn's end, or read anew
                if handled.upcoming == [] and key not in self._again:
                    break
        except LeaseLost:
            log.warning("lease_lost", fence=lease.fence)
            return False
        except asyncio.CancelledError:
            if self._stopping:
                self._abandoned.append(lease)  # `hand_over` gives it up
            raise
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            structlog.contextvars.unbind_contextvars("session_key", "channel", "event_id")
            self.store.sessions.release(key)  # cached state is only valid under this lease
        if released.is_set():
            return False
        return await self.store.release(lease)

    async def _handle(self, lease: SessionLease, rows: list[InboxRow], slot: Slot) -> Handled | None:
        structlog.contextvars.bind_contextvars(channel=rows[0].channel, event_id=rows[0].event_id)
        try:
            # A failed attempt leaves its rows unfinished: they are tried again, and failed
            # once their attempts are used up (`Handler`).
            return await self.handler.handle(lease, rows, slot)
        except LeaseLost:
            raise
        except Exception as exc:
            log_failure(log, "turn_failed", exc)
            await asyncio.sleep(0.2)
            return None

    async def _renew(self, lease: SessionLease, worker: asyncio.Task[None], released: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.lease_ttl / 3)
            try:
                # Cancelled when the drain ends, maybe mid-statement: shielded, the renewal
                # finishes and returns its pooled connection regardless.
                held = await shielded(self.store.renew(lease))
            except Exception as exc:
                log_failure(log, "lease_renew_failed", exc)
                continue
            if not held:
                # A turn's end may have given it up, its worker about to notice: no
                # takeover then. (A real takeover loses nothing by the wait: writes under
                # the old fence fail.)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await released.wait()
                        return
                log.warning("lease_taken_over", fence=lease.fence)
                worker.cancel()  # stop the model call early; writes would fail anyway
                return
