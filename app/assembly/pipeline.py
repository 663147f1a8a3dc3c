"""The event's way, bottom up (docs/architecture.md): waiters, replies, busy policies, the
command registry, mid-run signals, access, the turn runner, the commands, the handler,
the scheduler and ingest."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

from app.access import AccessGate
from app.access.notices import Notices
from app.access.roles import Roles
from app.access.store import AccessStore
from app.agents.handoff import Handoffs, chained
from app.agents.senders import SessionSenders
from app.assembly.agents import AgentQuotas, Agents
from app.assembly.channels import Outbound
from app.assembly.commands import fill_registry
from app.assembly.observation import Observed
from app.assembly.record import Built
from app.assembly.storage import Storage
from app.channel import ChannelSettings
from app.config import Settings
from app.dead_letters import DeadLetters
from app.event_reader import stored_as
from app.pipeline.busy import BusyPolicies
from app.pipeline.commands import CommandRegistry
from app.pipeline.feed import SessionFeed
from app.pipeline.handling import Handler
from app.pipeline.ingest import Ingest
from app.pipeline.midrun import MidRun
from app.pipeline.platform_events import PlatformEvents
from app.pipeline.replies import Replies
from app.pipeline.scheduler import Scheduler
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import WindowLimits
from app.pipeline.waiters import Waiters
from app.usage.meter import UsageMeter
from app.usage_settings import UsageSettings


@dataclass(frozen=True, eq=False)  # compared by identity, as `Parts` is
class Way:
    waiters: Waiters
    replies: Replies
    policies: BusyPolicies
    commands: CommandRegistry
    midrun: MidRun
    access: AccessGate
    usage: UsageMeter
    roles: Roles
    turns: TurnRunner
    senders: SessionSenders
    handoffs: Handoffs
    handler: Handler
    scheduler: Scheduler
    ingest: Ingest
    dead_letters: DeadLetters


def build_way(
    built: Built,
    settings: Settings,
    channel_settings: Mapping[str, ChannelSettings],
    storage: Storage,
    agents: Agents,
    outbound: Outbound,
    observed: Observed,
    owner: str,
    usage_settings: UsageSettings,
) -> Way:
    store, engine, sender = storage.store, storage.engine, outbound.sender
    waiters = built.part("waiters", Waiters(store))
    replies = built.part(
        "replies", Replies(store, waiters, delivers=sender.delivers, on_outbox=sender.notify)
    )
    policies = built.part(
        "policies",
        BusyPolicies(
            {name: cs.busy_policy for name, cs in channel_settings.items()},
            collect_debounce=settings.collect_debounce_seconds,
            max_attempts=settings.max_event_attempts,
        ),
    )
    # Filled below, once the families are built (`fill_registry`): they need the turns,
    # which need the mid-run signals, which ask the registry what a command is.
    commands = built.part("commands", CommandRegistry())
    midrun = built.part("midrun", MidRun(store, commands, policies, stop_poll=settings.stop_poll_seconds))
    # Who may talk and how much (`app.access`): decided at ingest, tokens counted by turns.
    notices = Notices(engine, delivers=sender.delivers, on_outbox=sender.notify)
    quotas = AgentQuotas(agents.agents)
    access = AccessGate(
        engine, channel_settings, agent_limits=quotas if quotas.any else None, notices=notices
    )
    built.part("access", access)
    # Every model call's usage and cost; budgets checked before each call (`app.usage`).
    usage = built.part(
        "usage", UsageMeter(engine, usage_settings, notify=notices.send, on_record=observed.usage)
    )
    # Who is who in a group (`app.access.roles`); adapters that look roles up join at start.
    roles = built.part("roles", Roles(channel_settings, stored=AccessStore(engine).has))
    turns = TurnRunner(
        store,
        agents.runner,
        replies,
        midrun,
        profiles=agents.agents,
        models=agents.models,
        limits=WindowLimits(settings.history_max_messages, settings.history_max_tokens),
        feed=SessionFeed(outbound.previews.observing(storage.bus)),
        after_turn=agents.memory.after_turn(),
        channel_settings=channel_settings,
        tools_allow=settings.tools_allow,
        tools_deny=settings.tools_deny,
        approval_timeout=settings.approval_timeout_seconds,
        on_run_finished=observed.run,
        recall=agents.memory.recall if agents.memory.enabled else None,
        context=agents.context,
        consolidator=agents.memory.consolidator,
        inbox_files=outbound.inbox_files,
        count_tokens=access.count_tokens,
        heartbeat_engine=engine,
        heartbeat_seconds=settings.session_heartbeat_seconds,
        roles=roles,  # tools are checked against the turn's senders
        usage=usage,
    )
    built.part("turns", turns)
    senders = built.part("senders", SessionSenders(engine))
    handoffs = Handoffs(
        replies,
        engine,
        storage.bus,
        locale_of=lambda channel: getattr(channel_settings.get(channel), "locale", "en"),
    )
    built.part("handoffs", handoffs)
    fill_registry(built, commands, settings, storage, agents, replies, turns, senders, handoffs, usage)
    # Edits, recalls, reactions, joins and button presses (docs/events.md).
    native = built.part("platform_events", PlatformEvents(store, replies, turns, commands, channel_settings))
    for command in native.commands():
        commands.add(command)
    handler = Handler(
        store,
        commands,
        turns,
        policies,
        replies,
        max_attempts=settings.max_event_attempts,
        channel_settings=channel_settings,
        roles=roles,
        native=native,
    )
    built.part("handler", handler)
    scheduler = Scheduler(
        store,
        handler,
        midrun,
        owner=owner,
        lease_ttl=settings.lease_ttl_seconds,
        max_concurrent_runs=settings.max_concurrent_runs,
        poll_interval=settings.inbox_poll_seconds,
        on_takeover=observed.metrics.lease_takeovers.inc,
    )
    built.part("scheduler", scheduler)
    ingest = Ingest(
        store,
        scheduler,
        waiters,
        channel_settings,
        gate=access,
        counted=observed.event,
        # the serving agent, then a /handoff redirect (app.agents.handoff)
        assign=chained(agents.agents.assign if agents.agents.book.several else None, handoffs.redirect),
        on_stored=senders.record,  # who spoke where, for /sessions across chats
        stored_as=partial(stored_as, engine),  # a retry is a duplicate before any quota
    )
    built.part("ingest", ingest)
    dead_letters = DeadLetters(
        engine, event_attempts=settings.max_event_attempts, delivery_attempts=settings.outbox_max_attempts
    )
    return Way(
        waiters,
        replies,
        policies,
        commands,
        midrun,
        access,
        usage,
        roles,
        turns,
        senders,
        handoffs,
        handler,
        scheduler,
        ingest,
        built.part("dead_letters", dead_letters),
    )
