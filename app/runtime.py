"""Everything a chatgate process runs, without HTTP: used by the API app and the CLI.

`Runtime` owns the engine, the pipeline (ingest, scheduler, handler, turns, outbox sender),
the agent and the enabled channel adapters, with an explicit lifecycle:
`await runtime.start()` … `await runtime.stop()` (or `async with runtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import structlog
from sqlalchemy import func, select

from app import tracing
from app.access import AccessGate, QuotaLimits
from app.access.notices import Notices
from app.agent.loop import AgentRunner
from app.agent.mcp import McpToolSource
from app.agent.offline import OfflineProvider
from app.agent.provider import ChatProvider
from app.agent.reminder import reminder_tools
from app.agent.send_file import send_file_tool
from app.agent.tools import Tool, ToolRegistry, builtin_tools
from app.agent.workspace import Workspace, file_tools
from app.agents.handoff import Handoffs, chained
from app.agents.links import LinkCommands
from app.agents.profiles import AgentBook, AgentRouter
from app.agents.senders import SessionSenders
from app.agents.session_commands import SessionCommands
from app.agents.skills import LoadSkillTool, SkillLibrary
from app.agents.workspaces import clean_workspaces
from app.bus import LocalSessionBus, SessionBus
from app.channel import AcceptResult, ChannelAdapter, ChannelContext, ChannelSettings
from app.channel_records import ChannelRecords
from app.config import Settings
from app.connection_leases import DatabaseConnections
from app.connections import ConnectionHolder
from app.db.engine import create_engine
from app.db.models import INBOX_UNFINISHED, OUTBOX_UNDELIVERED, utcnow
from app.db.models import inbox as inbox_table
from app.db.models import outbox as outbox_table
from app.dead_letters import DeadLetterFilter, DeadLetters, Resolved
from app.event_reader import ChannelEvents
from app.events import InboundEvent
from app.memory import MemoryFeatures
from app.metrics import Metrics
from app.migrate import upgrade, wait_for_database
from app.pg_bus import PgSessionBus
from app.pipeline import retention
from app.pipeline.approvals import timeout_events
from app.pipeline.builtin_commands import BuiltinCommands
from app.pipeline.busy import BusyPolicies
from app.pipeline.commands import CommandRegistry
from app.pipeline.feed import SessionFeed
from app.pipeline.handling import Handler
from app.pipeline.inbox_files import InboxFiles
from app.pipeline.ingest import Ingest
from app.pipeline.midrun import MidRun
from app.pipeline.outbox import OutboxSender
from app.pipeline.replies import Replies
from app.pipeline.scheduler import Scheduler
from app.pipeline.storage import build_store
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import WindowLimits
from app.pipeline.waiters import Waiters
from app.scheduling import JobStore, UsesJobStore
from app.sessions.store import Lifecycle, SessionStore
from app.sessions.tokens import ContextLimits
from app.speech import SpeechToText
from app.streaming import PreviewHub, StreamingChannel

log = structlog.get_logger(__name__)


def default_owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def build_provider(settings: Settings) -> ChatProvider:
    if settings.llm_provider == "offline":
        return OfflineProvider(
            latency_ms=settings.offline_latency_ms, stream_delay_ms=settings.offline_stream_delay_ms
        )
    from app.agent.openai_provider import OpenAIProvider  # imported only when configured

    return OpenAIProvider.from_settings(settings)


def load_channel_settings(names: Sequence[str]) -> dict[str, ChannelSettings]:
    """Read each named channel's settings from the environment (imports its package)."""
    from channels import load_spec

    loaded = {name: load_spec(name).settings_class() for name in names}
    # A2A is served as soon as callers are configured, without listing it in CHANNELS.
    if "a2a" not in loaded and os.environ.get("A2A_TOKENS", "").strip():
        loaded["a2a"] = load_spec("a2a").settings_class()
    return loaded


class Runtime:
    def __init__(
        self,
        settings: Settings,
        *,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        provider: ChatProvider | None = None,
        tools: Sequence[Tool] | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.settings = settings
        self.channel_settings = dict(
            channel_settings if channel_settings is not None else load_channel_settings(settings.channels)
        )
        self.provider = provider or build_provider(settings)
        self.tools = ToolRegistry(tools if tools is not None else builtin_tools())
        if tools is None and settings.workspace_root:  # read_file, list_files, write_file (risky)
            for tool in file_tools(settings.workspace_root, per_session=settings.workspace_per_session):
                self.tools.register(tool)
            self.tools.register(
                send_file_tool(
                    settings.workspace_root,
                    per_session=settings.workspace_per_session,
                    max_bytes=settings.send_file_max_bytes,
                )
            )
        # Files users send are kept in their session's workspace (per-session only).
        per_session = settings.workspace_root if settings.workspace_per_session else None
        self.inbox_files = InboxFiles(Workspace(per_session, per_session=True) if per_session else None)
        self.metrics = metrics or Metrics()
        self._unserved_seen: set[str] = set()
        self.owner = settings.worker_id or default_owner()
        self.engine = create_engine(settings)
        # --- scheduler: stored cron jobs; the cron channel fires them, the agent schedules them
        self.jobs = JobStore(self.engine)
        if "cron" in self.channel_settings:
            for tool in reminder_tools(self.jobs):
                if tool.spec.name not in self.tools:
                    self.tools.register(tool)
        # --- end scheduler
        lifecycles = {
            name: Lifecycle(
                suspend_after=cs.suspend_after_seconds or settings.suspend_after_seconds,
                expire_after=cs.expire_after_seconds or settings.expire_after_seconds,
                archive_after=cs.archive_after_seconds or settings.archive_after_seconds,
            )
            for name, cs in self.channel_settings.items()
        }
        self.sessions = SessionStore(
            self.engine,
            Lifecycle(
                settings.suspend_after_seconds,
                settings.expire_after_seconds,
                settings.archive_after_seconds,
            ),
            lifecycles,
        )
        # The pipeline's storage, chosen once (`app.pipeline.storage`).
        self.store = build_store(
            self.engine, self.sessions, lease_ttl=settings.lease_ttl_seconds, kind=settings.pipeline_store
        )
        # --- memory and MCP: recall into runs, remember/recall tools, consolidation, MCP tools
        self.memory = MemoryFeatures.from_settings(self.engine, settings, self.provider)
        for tool in self.memory.tools():
            if tool.spec.name not in self.tools:
                self.tools.register(tool)
        self.mcp = McpToolSource.from_settings(settings, self.tools)  # connects in start()
        # --- end memory and MCP
        self.agents = AgentRouter(AgentBook.load(settings.agents_file), self.engine)
        self.memory.use_namespaces(self.agents.namespace_of)  # an agent's memory_namespace
        self.skills = SkillLibrary(settings.skills_dir, self.agents.book, self.engine)
        if self.skills.any:
            self.tools.register(LoadSkillTool(self.skills))
        self.runner = AgentRunner(
            self.provider,
            self.tools,
            system_prompt=settings.system_prompt,
            context_sources=[self.agents.persona, self.skills.context, *self.memory.context_sources()],
            max_iterations=settings.agent_max_iterations,
            max_tool_result_chars=settings.tool_result_max_chars,
        )
        # PostgreSQL LISTEN/NOTIFY across replicas; in-process on SQLite (one process).
        self.bus: SessionBus = (
            LocalSessionBus() if settings.is_sqlite else PgSessionBus(settings.database_url)
        )
        self.adapters: dict[str, ChannelAdapter] = {}
        # Streaming previews (`app.streaming`): the hub watches the feed; replies of a
        # streaming channel reach its adapter through the hub (the preview's last edit).
        self.previews = PreviewHub(
            self.engine,
            locales={name: cs.locale for name, cs in self.channel_settings.items()},
            first_preview_after=settings.stream_first_preview_seconds,
            still_working_after=settings.stream_still_working_seconds,
        )
        self._delivery: dict[str, ChannelAdapter] = {}
        # Platform calls carry the delivery's `traceparent` when tracing is on (app.tracing).
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(15.0), event_hooks=tracing.httpx_hooks())
        self.speech = SpeechToText.from_settings(settings)  # voice messages, when STT_MODEL is set
        # Long-lived platform connections (polling, sockets): one holder (`app.connections`).
        # Fenced leases in the database: one holder across every replica on it.
        self.connections: ConnectionHolder = DatabaseConnections(
            self.engine,
            self.owner,
            ttl=settings.connection_lease_ttl_seconds,
            on_change=lambda name, held: self.metrics.connection_held.labels(name, self.owner).set(int(held)),
            on_takeover=lambda name: self.metrics.connection_takeovers.labels(name).inc(),
        )
        self.sender = OutboxSender(
            self.engine,
            self._delivery,
            poll_interval=settings.outbox_poll_seconds,
            max_attempts=settings.outbox_max_attempts,
            backoff_base=settings.outbox_backoff_base_seconds,
            backoff_max=settings.outbox_backoff_max_seconds,
            claim_seconds=settings.outbox_claim_seconds,
            on_result=lambda ch, res: self.metrics.deliveries.labels(ch, res).inc(),
        )
        # --- the event's way, bottom up (docs/architecture.md)
        self.waiters = Waiters(self.store)
        self.replies = Replies(self.waiters, delivers=self.sender.delivers, on_outbox=self.sender.notify)
        self.policies = BusyPolicies(
            {name: cs.busy_policy for name, cs in self.channel_settings.items()},
            collect_debounce=settings.collect_debounce_seconds,
            max_attempts=settings.max_event_attempts,
        )
        self.commands = CommandRegistry()
        self.midrun = MidRun(self.store, self.commands, self.policies, stop_poll=settings.stop_poll_seconds)
        context_limits = ContextLimits(
            settings.llm_context_tokens, settings.llm_context_tokens_by_model, settings.llm_reply_tokens
        )
        self.turns = TurnRunner(
            self.store,
            self.runner,
            self.replies,
            self.midrun,
            limits=WindowLimits(settings.history_max_messages, settings.history_max_tokens),
            models={name: cs.llm_model for name, cs in self.channel_settings.items()},
            feed=SessionFeed(self.previews.observing(self.bus)),
            after_turn=self.memory.after_turn(),
            channel_settings=self.channel_settings,
            tools_allow=settings.tools_allow,
            tools_deny=settings.tools_deny,
            approval_timeout=settings.approval_timeout_seconds,
            on_run_finished=self._observe_run,
            recall=self.memory.recall if self.memory.enabled else None,
            context=context_limits,
        )
        # The summary request of consolidation is asked of LLM_MODEL: its context bounds it.
        self.memory.bound_summaries(
            lambda key: context_limits.budget(settings.llm_model, self.agents.context_tokens_of_key(key))
        )
        self.turns.fit.consolidator = self.memory.consolidator
        self.turns.inbox_files = self.inbox_files
        self.turns.fit.agent_tokens = self.agents.context_tokens_of
        self.turns.tools.agent_tools = self.agents.tools_of  # an agent's policies hold in its runs
        self.turns.tools.approval_rules.agent_approvers = self.agents.approvers_of
        self.turns.window.agent_model = self.agents.model_of
        self.turns.window.heartbeat_engine = self.engine
        self.turns.window.heartbeat_seconds = settings.session_heartbeat_seconds
        for command in BuiltinCommands(self.store, self.replies, self.turns).commands(self.commands):
            self.commands.add(command)
        self.senders = SessionSenders(self.engine)
        session_commands = SessionCommands(
            self.store,
            self.replies,
            channel_models=self.turns.models,
            default_model=settings.llm_model,
            allowed_models=settings.llm_models,
            window_limit=settings.history_max_messages,
            turns=self.turns,
            consolidator=self.memory.consolidator,
            agents=self.agents,
            skills=self.skills,
        )
        session_commands.senders = self.senders  # /sessions lists the sender's other chats
        more = session_commands.agent_commands() if self.agents.book.several else []
        more += session_commands.skill_commands() if self.skills.any else []
        more += LinkCommands(self.store, self.replies, self.engine).commands()  # /link, /unlink
        self.handoffs = Handoffs(
            self.store,
            self.replies,
            self.engine,
            self.bus,
            locale_of=lambda channel: getattr(self.channel_settings.get(channel), "locale", "en"),
        )
        more += self.handoffs.commands()
        for command in [*session_commands.commands(), *session_commands.history_commands(), *more]:
            self.commands.add(command)
        self.handler = Handler(
            self.store,
            self.commands,
            self.turns,
            self.policies,
            self.replies,
            max_attempts=settings.max_event_attempts,
            channel_settings=self.channel_settings,
        )
        self.scheduler = Scheduler(
            self.store,
            self.handler,
            self.midrun,
            owner=self.owner,
            lease_ttl=settings.lease_ttl_seconds,
            max_concurrent_runs=settings.max_concurrent_runs,
            poll_interval=settings.inbox_poll_seconds,
            on_takeover=self.metrics.lease_takeovers.inc,
        )
        # Who may talk and how much (`app.access`): decided at ingest, tokens counted by turns.
        self._agent_quotas = {name: QuotaLimits.of(p) for name, p in self.agents.book.agents.items()}
        self.access = AccessGate(
            self.engine,
            self.channel_settings,
            agent_limits=self._agent_limits,
            notices=Notices(self.engine, delivers=self.sender.delivers, on_outbox=self.sender.notify),
        )
        self.turns.count_tokens = self.access.count_tokens
        self.ingest = Ingest(
            self.store,
            self.scheduler,
            self.waiters,
            self.channel_settings,
            gate=self.access,
            counted=self._count_event,
            # the serving agent, then a /handoff redirect (app.agents.handoff)
            assign=chained(self.agents.assign if self.agents.book.several else None, self.handoffs.redirect),
            on_stored=self.senders.record,  # who spoke where, for /sessions across chats
        )
        self.dead_letters = DeadLetters(
            self.engine,
            event_attempts=settings.max_event_attempts,
            delivery_attempts=settings.outbox_max_attempts,
        )
        self._approvals: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._started = False

    # --- lifecycle ------------------------------------------------------------------

    async def start(self) -> None:
        await wait_for_database(self.engine, self.settings.db_connect_retry_seconds)
        if self.settings.auto_migrate:
            await upgrade(self.settings.database_url)
        from channels import load_spec

        for name, cs in self.channel_settings.items():
            spec = load_spec(name)
            self.adapters[name] = spec.factory(cs, self.context_for(name))
        for adapter in self.adapters.values():  # the cron channel fires jobs of the shared store
            if isinstance(adapter, UsesJobStore):
                adapter.use_job_store(self.jobs)
        for adapter in self.adapters.values():
            await adapter.start()
        for name, adapter in self.adapters.items():  # a started adapter knows its clients
            if isinstance(adapter, StreamingChannel):
                self.previews.use(name, adapter.streamer())
            self._delivery[name] = self.previews.wrap(name, adapter)
        await self.bus.start()
        await self.handoffs.start()  # follows handoff changes on the bus
        await self.memory.start()  # global facts file
        await self.mcp.start()  # a dead MCP server is logged, never fatal
        await self.sender.start()
        await self.scheduler.start()
        self._sweeper = asyncio.create_task(self._sweep_loop(), name="lifecycle-sweeper")
        self._approvals = asyncio.create_task(self._approval_timeouts(), name="approval-timeouts")
        self._started = True
        log.info("runtime_started", owner=self.owner, channels=sorted(self.adapters))

    async def stop(self) -> None:
        for task in (self._sweeper, self._approvals):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.scheduler.stop()
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

    def _agent_limits(self, event: InboundEvent) -> tuple[str, QuotaLimits]:
        """The serving agent's name and quotas (its profile's `quota_*` fields)."""
        name = self.agents.agent_of(event).name
        return name, self._agent_quotas[name]

    def _count_event(self, channel: str, outcome: str) -> None:
        counter = {
            "accepted": self.metrics.events_accepted,
            "deduplicated": self.metrics.events_deduplicated,
            "skipped": self.metrics.events_skipped,
        }[outcome]
        counter.labels(channel).inc()

    def _observe_run(self, outcome: str, seconds: float, provider: str) -> None:
        self.metrics.run_duration.labels(outcome).observe(seconds)
        if outcome == "provider_error":
            self.metrics.provider_errors.labels(provider).inc()

    async def refresh_backlog_gauges(self) -> None:
        async with self.engine.connect() as conn:
            pending_in = (
                await conn.execute(
                    select(func.count())
                    .select_from(inbox_table)
                    .where(inbox_table.c.status.in_(INBOX_UNFINISHED))
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
            transcribe=self.speech.transcribe if self.speech is not None else None,
            keeps_files=self.inbox_files.enabled,
            agents=self.skills.listing() if self.agents.book.several else (),
        )
