"""Run metrics observed from the session bus.

The turn handler publishes a run's final answer with its `run_id` right after the commit
that also finished the run row; this wrapper around the bus sees that publish (only the
replica that ran the turn publishes it) and observes the run's duration and outcome from
the row, in the background, so the turn is not slowed down.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from typing import Any

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.bus import SessionBus
from app.db.models import runs
from app.metrics import Metrics

log = structlog.get_logger(__name__)


class RunMetricsBus:
    """A `SessionBus` that forwards everything to `inner` and observes finished runs."""

    def __init__(self, inner: SessionBus, engine: AsyncEngine, metrics: Metrics) -> None:
        self.inner = inner
        self.engine = engine
        self.metrics = metrics
        self._seen: OrderedDict[int, None] = OrderedDict()
        self._pending: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        await self.inner.start()

    async def stop(self) -> None:
        if self._pending:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*self._pending, return_exceptions=True), 2.0)
        await self.inner.stop()

    async def publish(self, key: str, event: dict[str, Any]) -> None:
        await self.inner.publish(key, event)
        run_id = event.get("run_id")
        if (
            event.get("type") == "message"
            and event.get("role") == "assistant"
            and not event.get("tool_calls")
            and isinstance(run_id, int)
            and run_id not in self._seen
        ):
            self._seen[run_id] = None
            if len(self._seen) > 10_000:
                self._seen.popitem(last=False)
            task = asyncio.create_task(self._observe(run_id))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def subscribe(self, key: str, maxsize: int = 1000) -> Any:
        return self.inner.subscribe(key, maxsize)

    def subscriber_count(self, key: str) -> int:
        count = getattr(self.inner, "subscriber_count", None)
        return int(count(key)) if count is not None else 0

    async def _observe(self, run_id: int) -> None:
        try:
            async with self.engine.connect() as conn:
                row = (
                    await conn.execute(
                        select(runs.c.outcome, runs.c.duration_ms, runs.c.provider).where(runs.c.id == run_id)
                    )
                ).first()
        except Exception:
            log.warning("run_metrics_read_failed", run_id=run_id, exc_info=True)
            return
        if row is None or row.duration_ms is None:
            return
        self.metrics.run_duration.labels(row.outcome).observe(row.duration_ms / 1000)
        if row.outcome == "provider_error":
            self.metrics.provider_errors.labels(row.provider).inc()
