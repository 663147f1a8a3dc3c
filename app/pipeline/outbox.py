"""The sender: delivers outbox rows through their channel, with retries and backoff.

Only the oldest undelivered row of each session key is claimable, so replies of one
conversation arrive in order even when several replicas send. A claim is a lease with a
deadline: a sender that dies mid-delivery leaves a row that is claimed again later. The
deadline is short (the runtime makes it no longer than the session lease TTL) and a
delivery in flight renews it, so a slow upload is not sent twice while a dead replica's
claims are free within the TTL. A sender that stops (SIGTERM) gives up the claims it
could not finish, so another replica sends them at once. A claim names its sender
(`owner`): when a claim's commit reached the database but its answer was lost (the
connection dropped after the commit), the same sender takes those rows again at its next
poll instead of waiting for the deadline; other replicas still wait for it.

With a `Pacer` (`app.pipeline.pacing`), a row is sent only in a slot its token buckets
(bot, chat, group; shared by the replicas) give it; a row whose slot is further than the
pacer's `max_wait` goes back to pending until then, its attempt not counted, and later
rows of its key wait behind it as they do behind a retry, so order and "sent once" hold.
A platform's `retry_after` pauses the chat's buckets for every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import and_, bindparam, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app import tracing
from app.channel import ChannelAdapter, delivers
from app.db.engine import autocommit
from app.db.models import outbox, utcnow
from app.db.outage import log_failure, unreachable
from app.errors import ChannelRateLimited, DeliveryError
from app.events import OutboundMessage
from app.pipeline.pacing import Pacer
from app.pipeline.storage.port import OutboxClaim, PipelineStore
from app.pipeline.storage.records import PaceGrant

log = structlog.get_logger(__name__)

RESULT_RETRY_SECONDS = 0.5  # how often an unrecorded delivery result is tried again
PAUSE_CHECK_AHEAD = 0.05  # a paced send reads the chat's pause this long before its slot


_FINISH = update(outbox).where(outbox.c.id == bindparam("id_")).values(claimed_until=None)
# A claim is ours while the row is `sending` with the attempt count our claim gave it.
_OURS = and_(
    outbox.c.id == bindparam("id_"), outbox.c.attempts == bindparam("a"), outbox.c.status == "sending"
)
_RENEW_CLAIM = update(outbox).where(_OURS).values(claimed_until=bindparam("until"))
# Every claim a stopping sender still holds, whether or not it saw the claim's answer.
_GIVE_UP_CLAIMS = (
    update(outbox)
    .where(outbox.c.status == "sending", outbox.c.claimed_by == bindparam("owner"))
    .values(status="pending", claimed_until=None, next_attempt_at=bindparam("now"))
)


class OutboxSender:
    def __init__(
        self,
        engine: AsyncEngine,
        store: PipelineStore,
        adapters: Mapping[str, ChannelAdapter],
        *,
        owner: str,
        poll_interval: float,
        max_attempts: int,
        backoff_base: float,
        backoff_max: float,
        batch_size: int = 100,
        claim_seconds: float = 30.0,
        on_result: Callable[[str, str], None] | None = None,
        pacer: Pacer | None = None,
    ) -> None:
        self.engine = engine
        self.pacer = pacer
        self.store = store  # claims through the port (`claim_outbox`)
        # Claims carry it: a claim whose commit landed but whose answer was lost is ours
        # to take again at the next poll, not after `claim_seconds`.
        self.owner = owner
        # Every write here is one statement: no BEGIN/COMMIT around it.
        self.single = autocommit(engine)
        self.adapters = adapters
        self.poll_interval = poll_interval
        self.max_attempts = max_attempts
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.batch_size = batch_size
        self.claim_seconds = claim_seconds
        self.on_result = on_result or (lambda channel, status: None)
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        # Results waiting to be written, each with the future its delivery waits on.
        self._results: list[tuple[dict[str, Any], asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._claimed: dict[int, int] = {}  # rows claimed and not yet done: id -> attempts
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="outbox-sender")
        self._renewer = asyncio.create_task(self._renew_claims(), name="outbox-claims")

    async def stop(self, grace: float = 5.0) -> None:
        """Let a delivery in flight record its result, then stop (cancel after `grace`)."""
        if self._task is None:
            return
        self._stopping = True
        self._wakeup.set()
        try:
            await asyncio.wait_for(asyncio.shield(self._task), grace)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._writer is not None:  # results of deliveries that were cancelled meanwhile
            await asyncio.wait({self._writer}, timeout=grace)
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self._give_up_claims()

    async def _renew_claims(self) -> None:
        """Keep the claims of deliveries in flight (fenced by their attempt count)."""
        while True:
            await asyncio.sleep(self.claim_seconds / 3)
            until = utcnow() + timedelta(seconds=self.claim_seconds)
            held = [{"id_": i, "a": a, "until": until} for i, a in self._claimed.items()]
            if not held:
                continue
            try:
                async with self.single.connect() as conn:
                    await conn.execute(_RENEW_CLAIM, held)
            except Exception as exc:  # the claim may lapse: the row is sent again, never lost
                log.warning("outbox_claim_renew_failed", error=repr(exc))

    async def _give_up_claims(self) -> None:
        """Claims of deliveries that did not finish: due again now, for any replica.

        By owner, not only the claims this sender knows of: a claim whose answer was lost
        is released too. Nothing of this sender is delivering any more.
        """
        held, self._claimed = self._claimed, {}
        try:
            async with self.single.connect() as conn:
                await conn.execute(_GIVE_UP_CLAIMS, {"owner": self.owner, "now": utcnow()})
        except Exception as exc:
            log.warning("outbox_claims_not_released", count=len(held), error=repr(exc))

    def notify(self) -> None:
        self._wakeup.set()

    def delivers(self, channel: str) -> bool:
        """Whether replies to `channel` need sending (`app.channel.delivers`).

        A channel this process does not run may be another replica's: its rows wait.
        """
        adapter = self.adapters.get(channel)
        return adapter is None or delivers(adapter)

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                claimed = await self.deliver_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log_failure(log, "outbox_loop_failed", exc)
                claimed = 0
            if claimed == 0 and not self._stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), self.poll_interval)
                self._wakeup.clear()

    async def deliver_due(self) -> int:
        """Claim due rows, deliver them (keys in parallel, each key in order); return the count."""
        rows = await self._claim()
        by_key: dict[str, list[Any]] = defaultdict(list)
        for row in rows:
            by_key[row["session_key"]].append(row)
        # Every delivery ends before this returns, even when one fails: the next claim may
        # take this sender's own claims again (see `OutboxClaim.owner`), which is right
        # only while none of them is still being delivered.
        ended = await asyncio.gather(*(self._deliver_key(g) for g in by_key.values()), return_exceptions=True)
        for outcome in ended:
            if isinstance(outcome, BaseException):
                raise outcome
        return len(rows)

    async def _claim(self) -> list[Any]:
        if not self.adapters:
            return []
        now = utcnow()
        claim = OutboxClaim(
            channels=tuple(sorted(self.adapters)),
            now=now,
            until=now + timedelta(seconds=self.claim_seconds),
            limit=self.batch_size,
            owner=self.owner,
        )
        rows = await self.store.claim_outbox(claim)
        for row in rows:
            self._claimed[row["id"]] = row["attempts"]
        return rows

    async def _deliver_key(self, rows: list[Any]) -> None:
        for row in rows:
            if not await self._deliver(row):
                # Later rows of this key wait for this one; release their claims.
                await self._unclaim([r["id"] for r in rows if r["id"] > row["id"]])
                return

    async def _deliver(self, row: Any) -> bool:
        adapter = self.adapters[row["channel"]]
        message = OutboundMessage.model_validate(row["payload"])
        grant: PaceGrant | None = None
        if self.pacer is not None:
            try:
                grant = await self._paced(row, message, self.pacer)
            except Exception as exc:  # the claim lapses: any replica sends it later, once
                log_failure(log, "pacing_failed", exc)
                self._claimed.pop(row["id"], None)
                return False
            if grant is None:
                return False
        held = [grant] if grant is not None else []
        try:
            return await self._send(row, adapter, message, held)
        finally:
            await self._release(message, held)

    async def _release(self, message: OutboundMessage, held: list[PaceGrant]) -> None:
        """The platform answered: the chat's next send may go (once; a hold not released,
        by a crash say, lapses by itself)."""
        if held and self.pacer is not None:
            grant = held.pop()
            with contextlib.suppress(Exception):
                await self.pacer.sent(message, grant)

    async def _send(
        self, row: Any, adapter: ChannelAdapter, message: OutboundMessage, held: list[PaceGrant]
    ) -> bool:
        try:
            with tracing.delivery(row) as span:  # continues the trace of the turn that wrote it
                result = await adapter.send(message)
                tracing.delivered(span, result.platform_message_id)
            await self._release(message, held)  # before its row is written: the chat goes on
        except ChannelRateLimited as exc:
            if self.pacer is not None:
                with contextlib.suppress(Exception):  # best-effort; the row's own retry waits too
                    await self.pacer.rate_limited(message, exc.retry_after)
                # The platform said "later", not "failed": the attempt is not counted.
                return await self._retry(row, str(exc), delay=exc.retry_after, counted=False)
            return await self._retry(row, str(exc), delay=exc.retry_after)
        except DeliveryError as exc:
            if not exc.retryable:
                await self._finish(row, "failed", error=exc.detail)
                return True
            return await self._retry(row, exc.detail)
        except Exception as exc:  # an adapter bug or unexpected network error: retry
            log.exception("send_crashed", channel=row["channel"])
            return await self._retry(row, f"{type(exc).__name__}: {exc}")
        await self._finish(row, "sent", platform_message_id=result.platform_message_id)
        return True

    async def _paced(self, row: Any, message: OutboundMessage, pacer: Pacer) -> PaceGrant | None:
        """Wait for the row's slot (the grant, released when the send is answered), or hand
        it back to pending until then (None)."""
        grant = await pacer.final(message)
        deadline = pacer.clock() + pacer.max_wait
        while grant.granted or (grant.busy and grant.at <= deadline):
            if not grant.granted:  # a send to the chat is in flight: its answer comes first
                await asyncio.sleep(pacer.wait(grant.at))
                grant = await pacer.final(message)
                continue
            # A `retry_after` another send got meanwhile (on any replica) holds this one
            # too: looked at just before the slot, so the send itself leaves on time.
            await asyncio.sleep(max(0.0, pacer.wait(grant.at) - PAUSE_CHECK_AHEAD))
            if await pacer.paused_until(message) <= grant.at:
                await asyncio.sleep(pacer.wait(grant.at))
                await pacer.leaving(message, grant.at)
                return grant
            await pacer.sent(message, grant)  # not sending in this slot: give the chat back
            grant = await pacer.final(message)
        await self._when_back(
            update(outbox)
            .where(
                outbox.c.id == row["id"], outbox.c.attempts == row["attempts"], outbox.c.status == "sending"
            )
            .values(
                status="pending",
                claimed_until=None,
                next_attempt_at=datetime.fromtimestamp(grant.at, UTC),
                attempts=outbox.c.attempts - 1,
            )
        )
        self._claimed.pop(row["id"], None)
        # Claim again when the slot comes (the poll interval may be longer).
        asyncio.get_running_loop().call_later(pacer.wait(grant.at), self._wakeup.set)
        return None

    async def _retry(self, row: Any, error: str, *, delay: float | None = None, counted: bool = True) -> bool:
        if row["attempts"] >= self.max_attempts and counted:
            await self._finish(row, "failed", error=error)
            return True
        if delay is None:
            delay = min(self.backoff_max, self.backoff_base * 2 ** (row["attempts"] - 1))
            delay *= random.uniform(0.8, 1.2)
        log.warning("send_retry", channel=row["channel"], attempts=row["attempts"], error=error)
        await self._when_back(
            update(outbox)
            .where(outbox.c.id == row["id"])
            .values(
                status="pending",
                claimed_until=None,
                last_error=error,
                next_attempt_at=utcnow() + timedelta(seconds=delay),
                attempts=outbox.c.attempts if counted else outbox.c.attempts - 1,
            )
        )
        self._claimed.pop(row["id"], None)
        self.on_result(row["channel"], "retry")
        return False

    async def _finish(
        self, row: Any, status: str, *, error: str | None = None, platform_message_id: str | None = None
    ) -> None:
        values: dict[str, Any] = {"id_": row["id"], "status": status}
        if status == "sent":
            values.update(sent_at=utcnow(), platform_message_id=platform_message_id)
        else:
            values["last_error"] = error
            log.error("send_failed", channel=row["channel"], error=error)
        written = asyncio.get_running_loop().create_future()
        self._results.append((values, written))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_results(), name="outbox-results")
        await written  # the next row of the key is sent only after this one is recorded
        self._claimed.pop(row["id"], None)
        self.on_result(row["channel"], status)

    async def _write_results(self) -> None:
        """Record the results of the deliveries that ended meanwhile, in one round trip.

        The deliveries of a claimed batch end within a few turns of the event loop when
        the channel answers at once; each waits until its own result is committed, as
        before, but the results go out together (executemany) instead of one statement
        each. The writer waits for more only while more keep arriving, at most ten turns.
        """
        gave_up_at: float | None = None
        while self._results:
            waiting = 0
            for _ in range(10):  # deliveries ending at about the same time join in
                if len(self._results) == waiting:
                    break
                waiting = len(self._results)
                await asyncio.sleep(0)
            batch, self._results = self._results, []
            shapes: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
            for values, _ in batch:
                shapes[tuple(sorted(values))].append(values)
            try:
                async with self.single.connect() as conn:
                    for rows in shapes.values():
                        await conn.execute(_FINISH, rows)
            except Exception as exc:
                now = asyncio.get_running_loop().time()
                gave_up_at = gave_up_at or now + self.claim_seconds
                if unreachable(exc) and now < gave_up_at:
                    # The database is away (a failover, a restart) and these deliveries
                    # happened: record them once it is back, instead of leaving their rows
                    # claimed for OUTBOX_CLAIM_SECONDS and then sending them again. Past
                    # the claim, another sender may have taken them: the claim decides.
                    self._results = batch + self._results
                    await asyncio.sleep(RESULT_RETRY_SECONDS)
                    continue
                for _, written in batch:
                    if not written.done():
                        written.set_exception(exc)
            else:
                gave_up_at = None
                for _, written in batch:
                    if not written.done():
                        written.set_result(None)

    async def _unclaim(self, ids: list[int]) -> None:
        if not ids:
            return
        for id_ in ids:
            self._claimed.pop(id_, None)
        await self._when_back(
            update(outbox)
            .where(outbox.c.id.in_(ids))
            .values(status="pending", claimed_until=None, attempts=outbox.c.attempts - 1)
        )

    async def _when_back(self, statement: Any) -> None:
        """Run a claim's release, again while the database is away (as `_write_results`):
        released now, the key's replies go on as soon as it is back, not after the claim."""
        give_up = asyncio.get_running_loop().time() + self.claim_seconds
        while True:
            try:
                async with self.single.connect() as conn:
                    await conn.execute(statement)
                return
            except Exception as exc:
                if not unreachable(exc) or asyncio.get_running_loop().time() >= give_up:
                    raise
                await asyncio.sleep(RESULT_RETRY_SECONDS)
