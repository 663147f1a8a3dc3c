"""Everything a chatgate process runs, without HTTP: used by the API app and the CLI.

`app.assembly` builds the parts (the engine, the pipeline, the agents, the channels'
side); `Runtime` is those parts with their lifecycle: `await runtime.start()` …
`await runtime.stop()` (or `async with runtime`), and the sweepers that run meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

import structlog
from sqlalchemy import func, select

from app.agent.provider import ChatProvider
from app.agent.tools import Tool
from app.agents.workspaces import clean_workspaces
from app.alerts import connection_conflicts
from app.assembly import Parts, assemble
from app.assembly.storage import StoreWrapper
from app.channel import AcceptResult, ChannelContext, ChannelSettings
from app.channel_records import ChannelRecords
from app.config import Settings
from app.db.engine import driver_connect_args
from app.db.models import INBOX_UNFINISHED, OUTBOX_UNDELIVERED, utcnow
from app.db.models import inbox as inbox_table
from app.db.models import outbox as outbox_table
from app.dead_letters import DeadLetterFilter, Resolved
from app.event_reader import ChannelEvents
from app.events import InboundEvent
from app.fetch import GuardedFetcher
from app.metrics import Metrics
from app.migrate import upgrade, wait_for_database
from app.pipeline import retention
from app.pipeline.approvals import timeout_events
from app.scheduling import UsesJobStore
from app.sessions.directory import UsesSessionDirectory
from app.shutdown import HandedOver, HandOver
from app.streaming.protocol import StreamingChannel

log = structlog.get_logger(__name__)

PACING_IDLE_SECONDS = 3600.0  # pacing buckets with nothing in the last hour are deleted


class Runtime(Parts):
    """The parts `app.assembly` built (its `Parts`: `runtime.ingest`, `runtime.engine` …)
    and their lifecycle."""

    def __init__(
        self,
        settings: Settings,
        *,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        provider: ChatProvider | None = None,
        tools: Sequence[Tool] | None = None,
        metrics: Metrics | None = None,
        wrap_store: StoreWrapper | None = None,
    ) -> None:
        parts = assemble(
            settings,
            channel_settings=channel_settings,
            provider=provider,
            tools=tools,
            metrics=metrics,
            wrap_store=wrap_store,
        )
        super().__init__(**{f.name: getattr(parts, f.name) for f in fields(Parts)})
        # SIGTERM hands the work over to other replicas at once (`app.shutdown`).
        self.handover = HandOver(
            turns=self.scheduler,
            connections=self.connections,
            replies=self.sender,
            grace=settings.shutdown_grace_seconds,
        )
        self._unserved_seen: set[str] = set()
        self._conflicts_seen: set[str] = set()  # channels whose connection conflicts were exported
        self._approvals: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._started = False

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        await wait_for_database(self.engine, self.settings.db_connect_retry_seconds)
        if self.settings.auto_migrate:
            await upgrade(self.settings.database_url, driver_connect_args(self.settings))
        from channels import load_spec

        for name, cs in self.channel_settings.items():
            spec = load_spec(name)
            self.adapters[name] = spec.factory(cs, self.context_for(name))
        for adapter in self.adapters.values():  # the cron channel fires jobs of the shared store
            if isinstance(adapter, UsesJobStore):
                adapter.use_job_store(self.jobs)
            if isinstance(adapter, UsesSessionDirectory):  # the MCP server reads sessions
                adapter.use_session_directory(self.directory)
        for adapter in self.adapters.values():
            await adapter.start()
        for name, adapter in self.adapters.items():  # a started adapter knows its clients
            if isinstance(adapter, StreamingChannel):
                self.previews.use(name, adapter.streamer())
            self.delivery[name] = self.previews.wrap(name, adapter)
            chat_roles = getattr(adapter, "chat_roles", None)  # a platform asked for roles (Telegram)
            if chat_roles is not None:
                self.roles.lookups[name] = chat_roles
            sender_role = getattr(adapter, "sender_role", None)  # one person asked for (Slack)
            if sender_role is not None:
                self.roles.sender_lookups[name] = sender_role
        await self.bus.start()
        await self.handoffs.start()  # follows handoff changes on the bus
        await self.memory.start()  # global facts file
        await self.mcp.start()  # a dead MCP server is logged, never fatal
        await self.sender.start()
        self.usage.start()  # usage rows written in the background (without budgets)
        await self.scheduler.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="lifecycle-sweeper")
        self._approvals = asyncio.create_task(self._approval_timeouts(), name="approval-timeouts")
        self._started = True
        log.info("runtime_started", owner=self.owner, channels=sorted(self.adapters))

    async def hand_over(self) -> HandedOver:
        """SIGTERM: refuse new work, finish turns within the grace, give everything up."""
        return await self.handover.run()

    async def stop(self) -> None:
        if self._started:
            # Without a SIGTERM first (Ctrl-C, a test's app): no grace, but leases, claims and
            # connections are given up all the same rather than left to expire.
            await self.handover.run(grace=None if self.handover.stopping else 0.0)
        for task in (self._sweeper, self._approvals):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.scheduler.stop()
        await self.usage.stop()  # what is still buffered is written
        await self.senders.stop()
        await self.sender.stop()
        await self.previews.stop()
        for adapter in self.adapters.values():
            with contextlib.suppress(Exception):
                await adapter.stop()
        await self.handoffs.stop()
        await self.bus.stop()
        await self.mcp.stop()
        await self.provider.aclose()
        if self.speech is not None:
            await self.speech.aclose()
        await self.http.aclose()
        await self.store.close()
        await self.engine.dispose()
        self._started = False

    async def __aenter__(self) -> Runtime:
        await self.start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lifecycle_sweep_seconds)
            try:
                moved = await self.sessions.sweep()
                if any(moved.values()):
                    log.info("sessions_swept", **moved)
                if self.settings.workspace_root and self.settings.workspace_per_session:
                    cleaned = await clean_workspaces(
                        self.engine, self.settings.workspace_root, self.settings.workspace_cleanup
                    )
                    if cleaned:
                        log.info("workspaces_cleaned", count=cleaned)
                pruned = await retention.prune(
                    self.engine,
                    inbox_days=self.settings.inbox_retention_days,
                    outbox_days=self.settings.outbox_retention_days,
                )
                pruned["stream_previews"] = await self.previews.prune(self.settings.outbox_retention_days)
                pruned["access"] = await self.access.prune()
                pruned["pacing_buckets"] = await self.store.prune_pace(time.time() - PACING_IDLE_SECONDS)
                if any(pruned.values()):
                    log.info("pipeline_rows_pruned", **pruned)
                await self.refresh_backlog_gauges()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("sweep_failed")

    async def _approval_timeouts(self) -> None:
        """Each timed-out approval becomes a `/deny` event of its session, handled in order
        under the key's lease like any other event (once, whichever replica finds it)."""
        while True:
            await asyncio.sleep(self.settings.approval_sweep_seconds)
            try:
                await self.expire_approvals()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("approval_sweep_failed")

    async def expire_approvals(self) -> int:
        """Queue the `/deny` of every approval past its deadline; returns how many were new."""
        async with self.engine.connect() as conn:
            events = await timeout_events(conn, utcnow())
        if not events:
            return 0
        results = await self.ingest.submit(events)
        return sum(1 for r in results if not r.duplicate)

    async def refresh_backlog_gauges(self) -> None:
        async with self.engine.connect() as conn:
            pending_in = (
                await conn.execute(
                    select(func.count())
                    .select_from(inbox_table)
                    .where(inbox_table.c.status.in_(INBOX_UNFINISHED))
                )
            ).scalar_one()
            cron_undelivered = (
                await conn.execute(
                    select(func.count())
                    .select_from(
                        outbox_table.join(inbox_table, inbox_table.c.event_id == outbox_table.c.event_id)
                    )
                    .where(outbox_table.c.status == "failed", inbox_table.c.channel == "cron")
                )
            ).scalar_one()
            by_channel: dict[str, int] = dict(
                (
                    await conn.execute(
                        select(outbox_table.c.channel, func.count())
                        .where(outbox_table.c.status.in_(OUTBOX_UNDELIVERED))
                        .group_by(outbox_table.c.channel)
                    )
                ).all()
            )
        self.metrics.inbox_backlog.set(pending_in)
        self.metrics.cron_undelivered.set(cron_undelivered)
        # Only a replica running the connection knows; one that stopped drops its series.
        conflicts = connection_conflicts(self.adapters)
        for name in self._conflicts_seen - set(conflicts):
            self.metrics.connection_conflicts.remove(name)
        for name, seen in conflicts.items():
            self.metrics.connection_conflicts.labels(name).set(seen.streak)
        self._conflicts_seen = set(conflicts)
        self.metrics.outbox_backlog.set(sum(by_channel.values()))
        # Replies for a channel no replica runs (removed from CHANNELS, or only other
        # replicas run it) wait, never lost and never failed by us: make them visible.
        unserved = {ch: n for ch, n in by_channel.items() if ch not in self.adapters}
        for channel in set(self._unserved_seen) - set(unserved):
            self.metrics.outbox_unserved.labels(channel).set(0)
        for channel, count in unserved.items():
            self.metrics.outbox_unserved.labels(channel).set(count)
            if channel not in self._unserved_seen:
                log.warning("outbox_channel_not_running", channel=channel, undelivered=count)
        self._unserved_seen = set(unserved)
        for kind, n in (await self.dead_letters.counts()).items():
            self.metrics.dead_letters.labels(kind).set(n)
        for server in self.mcp.status():
            self.metrics.mcp_server_up.labels(server["name"]).set(1 if server["state"] == "up" else 0)

    async def retry_dead_letters(self, which: DeadLetterFilter) -> list[Resolved]:
        """Re-queue dead letters once more and wake the worker or sender that takes them."""
        retried = await self.dead_letters.retry(which)
        for item in retried:
            if item.kind == "inbox":
                self.scheduler.notify(item.session_key)
        if any(item.kind == "outbox" for item in retried):
            self.sender.notify()
        return retried

    # --- ingest -----------------------------------------------------------------------

    def context_for(self, name: str) -> ChannelContext:
        async def accept(events: Sequence[InboundEvent]) -> list[AcceptResult]:
            return await self.ingest.accept(name, events)

        return ChannelContext(
            accept=accept,
            wait_for_replies=self.waiters.wait_for_replies,
            http=self.http,
            hold_connection=self.connections.hold_connection,
            connection_state=self.connections,
            events=ChannelEvents(self.engine, name),
            records=ChannelRecords(self.engine, name, on_outbox=self.sender.notify),
            transcribe=self.usage.transcriber(self.speech) if self.speech is not None else None,
            keeps_files=self.inbox_files.enabled,
            fetcher=GuardedFetcher(allow_private_hosts=self.settings.media_allow_private_hosts),
            agents=self.skills.listing() if self.agents.book.several else (),
        )
