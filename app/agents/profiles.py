"""Agents (profiles) and the routes that bind them to conversations.

An agent has a name, a system prompt (added after the global `SYSTEM_PROMPT`), a model
and the models `/model` may choose, tool lists, skills, a memory namespace and approvers.
They come from `AGENTS_FILE` (YAML or TOML, by its suffix)::

    default: assistant
    agents:
      - name: assistant
        system_prompt: You are a helpful assistant.
      - name: support
        system_prompt: You answer questions about our product.
        model: gpt-4o
        users: [alice]          # who may /agent to it; empty: everyone
    routes:                     # first match wins; unset fields match anything
      - {channel: slack, chat: C0SUPPORT, agent: support}
      - {chat_type: direct, agent: assistant}

Without a file there is one agent, `default`, which is today's behaviour. The agent is
part of a conversation's session key unless it is the default agent
(`InboundEvent.agent`), so two agents in one chat never share a history.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.tools import ToolContext
from app.db.models import agent_choices, utcnow
from app.db.upsert import insert_for
from app.events import DEFAULT_AGENT, InboundEvent, agent_in_key


@dataclass(frozen=True)
class AgentProfile:
    name: str
    description: str = ""
    system_prompt: str = ""
    model: str | None = None
    models: tuple[str, ...] = ()
    tools_allow: tuple[str, ...] = ()
    tools_deny: tuple[str, ...] = ()
    skills: tuple[str, ...] = ()
    skills_dir: str | None = None  # this agent's own skills (app.agents.skills)
    memory_namespace: str | None = None
    approvers: tuple[str, ...] = ()
    users: tuple[str, ...] = ()  # senders who may switch to it; empty: everyone
    # Context windows of its models in tokens, over LLM_CONTEXT_TOKENS(_BY_MODEL).
    context_tokens: Mapping[str, int] = field(default_factory=dict)
    # Quotas of this agent's conversations (app.access), on top of the channel's.
    quota_sender_messages_per_minute: int | None = None
    quota_session_messages_per_minute: int | None = None
    quota_sender_tokens_per_day: int | None = None
    quota_session_tokens_per_day: int | None = None

    def usable_by(self, sender_id: str) -> bool:
        return not self.users or sender_id in self.users


@dataclass(frozen=True)
class Route:
    agent: str
    channel: str | None = None
    chat: str | None = None
    thread: str | None = None
    sender: str | None = None
    chat_type: str | None = None

    def matches(self, event: InboundEvent) -> bool:
        wanted = (
            (self.channel, event.channel),
            (self.chat, event.chat_id),
            (self.thread, event.thread_id),
            (self.sender, event.sender_id),
            (self.chat_type, event.chat_type.value),
        )
        return all(want is None or want == have for want, have in wanted)


_LISTS = ("models", "tools_allow", "tools_deny", "skills", "approvers", "users")


def _profile(raw: Mapping[str, Any]) -> AgentProfile:
    if not isinstance(raw, Mapping) or not raw.get("name"):
        raise ValueError(f"an agent needs a name: {raw!r}")
    known = set(AgentProfile.__dataclass_fields__)
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"agent {raw['name']!r}: unknown fields {sorted(unknown)}")
    values: dict[str, Any] = {k: tuple(str(x) for x in v) if k in _LISTS else v for k, v in raw.items()}
    tokens = values.get("context_tokens", {})
    if not isinstance(tokens, Mapping) or not all(isinstance(n, int) and n > 0 for n in tokens.values()):
        raise ValueError(f"agent {raw['name']!r}: context_tokens maps models to token counts")
    namespace = values.get("memory_namespace")
    if namespace is not None and (not isinstance(namespace, str) or not 0 < len(namespace) <= 100):
        raise ValueError(f"agent {raw['name']!r}: memory_namespace is a name of 1-100 characters")
    return AgentProfile(**values)


@dataclass
class AgentBook:
    agents: dict[str, AgentProfile] = field(
        default_factory=lambda: {DEFAULT_AGENT: AgentProfile(DEFAULT_AGENT)}
    )
    routes: list[Route] = field(default_factory=list)
    default: str = DEFAULT_AGENT

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> AgentBook:
        profiles = [_profile(raw) for raw in data.get("agents") or ()]
        if not profiles:
            profiles = [AgentProfile(DEFAULT_AGENT)]
        agents = {p.name: p for p in profiles}
        if len(agents) != len(profiles):
            raise ValueError("two agents have the same name")
        default = str(data.get("default") or profiles[0].name)
        routes = [Route(**raw) for raw in data.get("routes") or ()]
        for name in [default, *(r.agent for r in routes)]:
            if name not in agents:
                raise ValueError(f"no agent named {name!r}")
        return cls(agents, routes, default)

    @classmethod
    def load(cls, path: str | None) -> AgentBook:
        if not path:
            return cls()
        text = Path(path).read_text(encoding="utf-8")
        data = tomllib.loads(text) if path.endswith(".toml") else yaml.safe_load(text)
        return cls.from_data(data or {})

    @property
    def several(self) -> bool:
        return len(self.agents) > 1

    def get(self, name: str | None) -> AgentProfile:
        return self.agents.get(name or self.default) or self.agents[self.default]

    def routed(self, event: InboundEvent) -> str:
        """The agent the routes give `event` (first match wins), else the default."""
        for route in self.routes:
            if route.matches(event):
                return route.agent
        return self.default

    def usable(self, sender_id: str) -> list[AgentProfile]:
        return [a for a in self.agents.values() if a.usable_by(sender_id)]


def base_key(event: InboundEvent) -> str:
    """The event's session key without an agent."""
    return event.model_copy(update={"agent": None}).session_key


class AgentRouter:
    """Puts the agent on each inbound event before it is stored (`Ingest`)."""

    def __init__(self, book: AgentBook, engine: AsyncEngine) -> None:
        self.book = book
        self.engine = engine

    async def choice(self, key: str) -> str | None:
        async with self.engine.connect() as conn:
            chosen = (
                await conn.execute(select(agent_choices.c.agent).where(agent_choices.c.key == key))
            ).scalar()
        return chosen if chosen in self.book.agents else None

    async def assign(self, event: InboundEvent) -> InboundEvent:
        if not self.book.several or event.session_key_override or event.source_session_key:
            return event
        if event.agent in self.book.agents:  # the channel named it (an A2A agent's own URL)
            return event.model_copy(update={"agent": None}) if event.agent == self.book.default else event
        name = await self.choice(base_key(event)) or self.book.routed(event)
        return event.model_copy(update={"agent": None if name == self.book.default else name})

    async def choose(self, event: InboundEvent, name: str) -> None:
        """Store `/agent NAME` for the conversation `event` belongs to."""
        values = {"key": base_key(event), "agent": name, "chosen_by": event.sender_id, "updated_at": utcnow()}
        async with self.engine.begin() as conn:
            stmt = insert_for(conn.dialect.name, agent_choices).values(**values)
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=["key"],
                    set_={k: values[k] for k in ("agent", "chosen_by", "updated_at")},
                )
            )

    def agent_of(self, event: InboundEvent) -> AgentProfile:
        return self.book.get(event.agent)

    def model_of(self, event: InboundEvent) -> str | None:
        return self.book.get(event.agent).model

    def context_tokens_of(self, event: InboundEvent) -> Mapping[str, int]:
        return self.book.get(event.agent).context_tokens

    def tools_of(self, key: str) -> tuple[Sequence[str], Sequence[str]]:
        """The tool lists (allow, deny) of the agent serving session `key`."""
        agent = self.book.get(agent_in_key(key))
        return agent.tools_allow, agent.tools_deny

    def context_tokens_of_key(self, key: str) -> Mapping[str, int]:
        """The context table of the agent serving session `key`."""
        return self.book.get(agent_in_key(key)).context_tokens

    def namespace_of(self, key: str) -> str:
        """The memory namespace of the agent serving session `key` ("" by default)."""
        return self.book.get(agent_in_key(key)).memory_namespace or ""

    def approvers_of(self, key: str) -> Sequence[str]:
        return self.book.get(agent_in_key(key)).approvers

    async def persona(self, ctx: ToolContext) -> str | None:
        """Context source of the run: the serving agent's system prompt."""
        return self.book.get(agent_in_key(ctx.session_key)).system_prompt or None
