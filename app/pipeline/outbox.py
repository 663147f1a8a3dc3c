"""The sender: delivers outbox rows through their channel, with retries and backoff.

Only the oldest undelivered row of each session key is claimable, so replies of one
conversation arrive in order even when several replicas send. A claim is a lease with a
deadline: a sender that dies mid-delivery leaves a row that is claimed again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

import structlog
from sqlalchemy import and_, bindparam, exists, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from sqlalchemy.orm import aliased

from app import tracing
from app.channel import ChannelAdapter, delivers
from app.db import direct
from app.db.direct import Direct
from app.db.engine import autocommit
from app.db.models import OUTBOX_UNDELIVERED, one_of, outbox, utcnow
from app.errors import ChannelRateLimited, DeliveryError
from app.events import OutboundMessage

log = structlog.get_logger(__name__)


@functools.cache
def _claim_statement(skip_locked: bool, channels: tuple[str, ...]) -> Direct:
    """Claim the due rows that are the oldest undelivered one of their key, in one statement.

    Built once per sender (its channels are fixed; `one_of`): it runs after every reply,
    on asyncpg directly (`app.db.direct`).
    """
    earlier = aliased(outbox)
    now: Any = bindparam("now")
    due = or_(
        and_(outbox.c.status == "pending", outbox.c.next_attempt_at <= now),
        and_(outbox.c.status == "sending", outbox.c.claimed_until < now),
    )
    blocked = exists().where(
        earlier.c.session_key == outbox.c.session_key,
        earlier.c.id < outbox.c.id,
        one_of(earlier.c.status, OUTBOX_UNDELIVERED),
    )
    candidates = (
        select(outbox.c.id)
        .where(due, ~blocked, one_of(outbox.c.channel, channels))
        .order_by(outbox.c.id)
        .limit(bindparam("limit"))
    )
    if skip_locked:  # PostgreSQL: replicas claiming at once pass over each other's rows
        candidates = candidates.with_for_update(skip_locked=True)
    return Direct(
        update(outbox)
        .where(outbox.c.id.in_(candidates.scalar_subquery()))
        .values(status="sending", claimed_until=bindparam("until"), attempts=outbox.c.attempts + 1)
        .returning(outbox)
    )


_FINISH = update(outbox).where(outbox.c.id == bindparam("id_")).values(claimed_until=None)


class OutboxSender:
    def __init__(
        self,
        engine: AsyncEngine,
        adapters: Mapping[str, ChannelAdapter],
        *,
        poll_interval: float,
        max_attempts: int,
        backoff_base: float,
        backoff_max: float,
        batch_size: int = 100,
        claim_seconds: float = 30.0,
        on_result: Callable[[str, str], None] | None = None,
    ) -> None:
        self.engine = engine
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

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="outbox-sender")

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
            except Exception:
                log.exception("outbox_loop_failed")
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
        await asyncio.gather(*(self._deliver_key(group) for group in by_key.values()))
        return len(rows)

    async def _claim(self) -> list[Any]:
        if not self.adapters:
            return []
        now = utcnow()
        params = {
            "now": now,
            "until": now + timedelta(seconds=self.claim_seconds),
            "limit": self.batch_size,
        }
        async with direct.connect(self.single) as conn:
            statement = _claim_statement(conn.dialect.name == "postgresql", tuple(sorted(self.adapters)))
            rows = await statement.rows(conn, params)
        return sorted(rows, key=lambda r: r["id"])

    async def _deliver_key(self, rows: list[Any]) -> None:
        for row in rows:
            if not await self._deliver(row):
                # Later rows of this key wait for this one; release their claims.
                await self._unclaim([r["id"] for r in rows if r["id"] > row["id"]])
                return

    async def _deliver(self, row: Any) -> bool:
        adapter = self.adapters[row["channel"]]
        message = OutboundMessage.model_validate(row["payload"])
        try:
            with tracing.delivery(row) as span:  # continues the trace of the turn that wrote it
                result = await adapter.send(message)
                tracing.delivered(span, result.platform_message_id)
        except ChannelRateLimited as exc:
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

    async def _retry(self, row: Any, error: str, *, delay: float | None = None) -> bool:
        if row["attempts"] >= self.max_attempts:
            await self._finish(row, "failed", error=error)
            return True
        if delay is None:
            delay = min(self.backoff_max, self.backoff_base * 2 ** (row["attempts"] - 1))
            delay *= random.uniform(0.8, 1.2)
        log.warning("send_retry", channel=row["channel"], attempts=row["attempts"], error=error)
        async with self.single.connect() as conn:
            await conn.execute(
                update(outbox)
                .where(outbox.c.id == row["id"])
                .values(
                    status="pending",
                    claimed_until=None,
                    last_error=error,
                    next_attempt_at=utcnow() + timedelta(seconds=delay),
                )
            )
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
        self.on_result(row["channel"], status)

    async def _write_results(self) -> None:
        """Record the results of the deliveries that ended meanwhile, in one round trip.

        The deliveries of a claimed batch end within a few turns of the event loop when
        the channel answers at once; each waits until its own result is committed, as
        before, but the results go out together (executemany) instead of one statement
        each. The writer waits for more only while more keep arriving, at most ten turns.
        """
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
                for _, written in batch:
                    if not written.done():
                        written.set_exception(exc)
            else:
                for _, written in batch:
                    if not written.done():
                        written.set_result(None)

    async def _unclaim(self, ids: list[int]) -> None:
        if not ids:
            return
        async with self.single.connect() as conn:
            await conn.execute(
                update(outbox)
                .where(outbox.c.id.in_(ids))
                .values(status="pending", claimed_until=None, attempts=outbox.c.attempts - 1)
            )
