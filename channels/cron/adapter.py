"""The cron channel: a ticker that fires due jobs into the pipeline.

Every `CRON_TICK_SECONDS` it asks the job store for due jobs and, for each, accepts an
event into the inbox and then claims the fire (moves `next_fire_at` on with a
compare-and-set). The inbox's unique `(channel, external_id)` with
`external_id = cron:{job_id}:{due}` makes a fire enter the pipeline at most once however
many replicas see it; accepting *before* claiming makes it at least once too: a replica
that dies between the two leaves the job due, and the next tick (here or elsewhere)
finds the event already accepted and only claims. So each fire runs exactly once.

The event lands on the job's source session (`source_session_key`) and carries a
`reply_target`, so the turn handler sends the answer to the job's chat through that
chat's own channel.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import structlog
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelSettings, SendResult
from app.errors import ChannelNotConfigured, ChannelRejected
from app.events import ROLE_KEY, InboundEvent, OutboundMessage, TextPart
from app.scheduling import CronJob, JobStore

log = structlog.get_logger(__name__)


class CronSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="CRON_", env_file=".env", extra="ignore")

    tick_seconds: float = Field(1.0, gt=0, description="How often due jobs are looked for.")
    batch_size: int = Field(100, ge=1, description="Due jobs fired per tick at most.")


@dataclass(frozen=True)
class Fire:
    """What one tick did with one due job."""

    job_id: int
    due: datetime
    event_id: str
    duplicate: bool  # the event was already in the inbox (another replica accepted it)
    claimed: bool  # this replica moved the job past `due`


def _utcnow() -> datetime:
    return datetime.now(UTC)


def fire_event(job: CronJob, due: datetime) -> InboundEvent:
    """The inbound event of one fire of `job`, due at `due`.

    A job a run made (a reminder) fires with the role of the person it served; one the
    operator made (API, CLI) with the owner's."""
    role = {ROLE_KEY: job.metadata["role"]} if isinstance(job.metadata.get("role"), str) else {}
    return InboundEvent(
        channel="cron",
        chat_id=str(job.id),
        sender_id="cron",
        parts=(TextPart(text=job.prompt),),
        external_id=f"cron:{job.id}:{due.isoformat()}",
        source_session_key=job.source_session_key,
        metadata={
            "reply_target": job.target.to_dict(),
            "cron_job_id": job.id,
            "cron_due_at": due.isoformat(),
            **role,
        },
    )


class CronChannel:
    name = "cron"

    def __init__(
        self,
        settings: CronSettings,
        context: ChannelContext,
        *,
        jobs: JobStore | None = None,
        clock: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.settings = settings
        self.context = context
        self.jobs = jobs
        self.clock = clock
        self._task: asyncio.Task[None] | None = None

    def use_job_store(self, jobs: JobStore) -> None:
        self.jobs = jobs

    async def start(self) -> None:
        if self.jobs is None:
            raise ChannelNotConfigured("the cron channel has no job store")
        self._task = asyncio.create_task(self._loop(), name="cron-ticker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def send(self, message: OutboundMessage) -> SendResult:
        # Fires carry a reply_target, so replies go to the job's chat; nothing is sent "to cron".
        raise ChannelRejected("the cron channel has no chat to deliver to; the job's target is used")

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("cron_tick_failed")
            await asyncio.sleep(self.settings.tick_seconds)

    async def tick(self, now: datetime | None = None) -> list[Fire]:
        """Fire every job due at `now` (default: the clock); return what happened."""
        if self.jobs is None:
            raise ChannelNotConfigured("the cron channel has no job store")
        now = now or self.clock()
        fires: list[Fire] = []
        for job in await self.jobs.due(now, limit=self.settings.batch_size):
            try:
                fires.append(await self._fire(self.jobs, job, now))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("cron_fire_failed", cron_job_id=job.id)
                with contextlib.suppress(Exception):
                    await self.jobs.record_error(job.id, f"{type(exc).__name__}: {exc}", now=now)
        return fires

    async def _fire(self, jobs: JobStore, job: CronJob, now: datetime) -> Fire:
        assert job.next_fire_at is not None
        due = job.next_fire_at
        [accepted] = await self.context.accept([fire_event(job, due)])
        claimed = await jobs.claim(job, now)
        if not accepted.duplicate:
            log.info(
                "cron_fired",
                cron_job_id=job.id,
                due=due.isoformat(),
                session_key=accepted.session_key,
                skipped=accepted.skipped,
            )
        return Fire(job.id, due, accepted.event_id, accepted.duplicate, claimed)
