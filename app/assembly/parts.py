"""Every part of a chatgate process, as the assembly built them (`app.assembly.assemble`)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access import AccessGate
from app.access.roles import Roles
from app.agent.loop import AgentRunner
from app.agent.mcp import McpToolSource
from app.agent.provider import ChatProvider
from app.agent.tools import ToolRegistry
from app.agents.handoff import Handoffs
from app.agents.profiles import AgentRouter
from app.agents.senders import SessionSenders
from app.agents.skills import SkillLibrary
from app.assembly.observation import Observed
from app.assembly.record import Built
from app.bus import SessionBus
from app.channel import ChannelAdapter, ChannelSettings
from app.config import Settings
from app.connections import ConnectionHolder
from app.dead_letters import DeadLetters
from app.memory import MemoryFeatures
from app.metrics import Metrics
from app.pipeline.busy import BusyPolicies
from app.pipeline.commands import CommandRegistry
from app.pipeline.handling import Handler
from app.pipeline.inbox_files import InboxFiles
from app.pipeline.ingest import Ingest
from app.pipeline.midrun import MidRun
from app.pipeline.outbox import OutboxSender
from app.pipeline.replies import Replies
from app.pipeline.scheduler import Scheduler
from app.pipeline.storage.port import PipelineStore
from app.pipeline.turn import TurnRunner
from app.pipeline.waiters import Waiters
from app.scheduling import JobStore
from app.sessions.directory import SessionDirectory
from app.sessions.profiles import SessionModels
from app.sessions.store import SessionStore
from app.speech import SpeechToText
from app.streaming.hub import PreviewHub
from app.usage.meter import UsageMeter


@dataclass(eq=False)  # a runtime is one process: compared (and hashed) by identity
class Parts:
    settings: Settings
    channel_settings: dict[str, ChannelSettings]
    owner: str  # this replica's name in leases
    # observation
    metrics: Metrics
    observed: Observed
    # storage
    engine: AsyncEngine
    jobs: JobStore
    sessions: SessionStore
    store: PipelineStore
    bus: SessionBus
    # agents
    provider: ChatProvider
    tools: ToolRegistry
    agents: AgentRouter
    memory: MemoryFeatures
    mcp: McpToolSource
    skills: SkillLibrary
    runner: AgentRunner
    models: SessionModels
    # channels: the adapters are made at start (`Runtime.start`); replies reach them
    # through `delivery` (the preview hub's wrap of each)
    adapters: dict[str, ChannelAdapter]
    delivery: dict[str, ChannelAdapter]
    previews: PreviewHub
    http: httpx.AsyncClient
    speech: SpeechToText | None
    connections: ConnectionHolder
    sender: OutboxSender
    inbox_files: InboxFiles
    directory: SessionDirectory  # sessions as API callers see them (the MCP server)
    # the event's way
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
    built: Built  # what was built, in order (`python -m app.assembly --graph`)
