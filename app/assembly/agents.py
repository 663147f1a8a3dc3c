"""Agents: the provider, the tools, the agent router (the sessions' profiles), memory, MCP,
skills, the run loop and the rule for a session's model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from app.access import QuotaLimits
from app.agent.loop import AgentRunner
from app.agent.mcp import McpToolSource
from app.agent.offline import OfflineProvider
from app.agent.provider import ChatProvider
from app.agent.reminder import reminder_tools
from app.agent.send_file import send_file_tool
from app.agent.tools import Tool, ToolRegistry, builtin_tools
from app.agent.workspace import file_tools
from app.agents.profiles import AgentBook, AgentRouter
from app.agents.skills import LoadSkillTool, SkillLibrary
from app.assembly.record import Built
from app.assembly.storage import Storage
from app.channel import ChannelSettings
from app.config import Settings
from app.events import InboundEvent
from app.memory import MemoryFeatures
from app.sessions.profiles import SessionModels
from app.sessions.tokens import ContextLimits


def build_provider(settings: Settings) -> ChatProvider:
    if settings.llm_provider == "offline":
        return OfflineProvider(
            latency_ms=settings.offline_latency_ms, stream_delay_ms=settings.offline_stream_delay_ms
        )
    from app.agent.openai_provider import OpenAIProvider  # imported only when configured

    return OpenAIProvider.from_settings(settings)


def build_tools(
    settings: Settings,
    channel_settings: Mapping[str, ChannelSettings],
    storage: Storage,
    tools: Sequence[Tool] | None,
) -> ToolRegistry:
    """The given tools, or the built-in ones with the workspace's and the scheduler's."""
    registry = ToolRegistry(tools if tools is not None else builtin_tools())
    if tools is None and settings.workspace_root:  # read_file, list_files, write_file (risky)
        for tool in file_tools(settings.workspace_root, per_session=settings.workspace_per_session):
            registry.register(tool)
        registry.register(
            send_file_tool(
                settings.workspace_root,
                per_session=settings.workspace_per_session,
                max_bytes=settings.send_file_max_bytes,
            )
        )
    if "cron" in channel_settings:
        for tool in reminder_tools(storage.jobs):
            if tool.spec.name not in registry:
                registry.register(tool)
    return registry


class AgentQuotas:
    """`AccessGate.agent_limits`: the serving agent's name and quotas (its `quota_*` fields)."""

    def __init__(self, agents: AgentRouter) -> None:
        self.agents = agents
        self.quotas = {name: QuotaLimits.of(p) for name, p in agents.book.agents.items()}
        self.any = any(q.any for q in self.quotas.values())  # whether any agent has a quota

    def __call__(self, event: InboundEvent) -> tuple[str, QuotaLimits]:
        name = self.agents.agent_of(event).name
        return name, self.quotas[name]


@dataclass(frozen=True, eq=False)  # compared by identity, as `Parts` is
class Agents:
    provider: ChatProvider
    tools: ToolRegistry
    agents: AgentRouter
    memory: MemoryFeatures
    mcp: McpToolSource
    skills: SkillLibrary
    runner: AgentRunner
    models: SessionModels
    context: ContextLimits


def build_agents(
    built: Built,
    settings: Settings,
    channel_settings: Mapping[str, ChannelSettings],
    storage: Storage,
    *,
    provider: ChatProvider | None,
    tools: Sequence[Tool] | None,
) -> Agents:
    engine = storage.engine
    chat = built.part("provider", provider or build_provider(settings))
    registry = built.part("tools", build_tools(settings, channel_settings, storage, tools))
    # The agents file: each session's agent, its model, tools, approvers, context, memory.
    agents = built.part("agents", AgentRouter(AgentBook.load(settings.agents_file), engine))
    context = ContextLimits(
        settings.llm_context_tokens, settings.llm_context_tokens_by_model, settings.llm_reply_tokens
    )
    memory = MemoryFeatures.from_settings(
        engine,
        settings,
        chat,
        namespace_of=agents.namespace_of,  # an agent's memory_namespace
        # The summary request of consolidation is asked of LLM_MODEL: its context bounds it.
        budget_of=lambda key: context.budget(settings.llm_model, agents.context_tokens_of_key(key)),
    )
    built.part("memory", memory)
    for tool in memory.tools():  # remember, recall
        if tool.spec.name not in registry:
            registry.register(tool)
    mcp = built.part("mcp", McpToolSource.from_settings(settings, registry))  # connects at start
    skills = built.part("skills", SkillLibrary(settings.skills_dir, agents.book, engine))
    if skills.any:
        registry.register(LoadSkillTool(skills))
    runner = AgentRunner(
        chat,
        registry,
        system_prompt=settings.system_prompt,
        context_sources=[agents.persona, skills.context, *memory.context_sources()],
        max_iterations=settings.agent_max_iterations,
        max_tool_result_chars=settings.tool_result_max_chars,
    )
    models = SessionModels(
        agents,
        {name: cs.llm_model for name, cs in channel_settings.items()},
        default=settings.llm_model,
        allowed=settings.llm_models,
    )
    return Agents(
        chat,
        registry,
        agents,
        memory,
        mcp,
        skills,
        built.part("runner", runner),
        built.part("models", models),
        context,
    )
