"""Commands: one registry, filled from every family (each family's `commands()`).

A family is a class whose collaborators are its constructor's arguments and whose
`commands()` lists its registry entries; a family that needs a feature the deployment
lacks (several agents, skills) is left out, so `/help` lists only what works here.
"""

from __future__ import annotations

from typing import Protocol

from app.agents.agent_commands import AgentCommands
from app.agents.handoff import Handoffs
from app.agents.history_commands import HistoryCommands
from app.agents.links import LinkCommands
from app.agents.senders import SessionSenders
from app.agents.session_commands import SessionCommands
from app.agents.skill_commands import SkillCommands
from app.agents.usage_commands import UsageCommands
from app.assembly.agents import Agents
from app.assembly.record import Built
from app.assembly.storage import Storage
from app.config import Settings
from app.pipeline.builtin_commands import BuiltinCommands
from app.pipeline.commands import Command, CommandRegistry
from app.pipeline.replies import Replies
from app.pipeline.turn import TurnRunner
from app.usage.meter import UsageMeter


class CommandFamily(Protocol):
    def commands(self) -> list[Command]: ...


def fill_registry(
    built: Built,
    registry: CommandRegistry,
    settings: Settings,
    storage: Storage,
    agents: Agents,
    replies: Replies,
    turns: TurnRunner,
    senders: SessionSenders,
    handoffs: Handoffs,
    usage: UsageMeter,
) -> None:
    store, router = storage.store, agents.agents
    session_commands = SessionCommands(
        store,
        replies,
        agents.models,
        agents=router,
        senders=senders,  # /sessions lists the sender's other chats
        window_limit=settings.history_max_messages,
    )
    families: list[CommandFamily] = [
        built.part("builtin_cmds", BuiltinCommands(store, replies, turns, registry)),
        built.part("session_cmds", session_commands),
        built.part("history_cmds", HistoryCommands(store, replies, turns, agents.memory.consolidator)),
    ]
    if router.book.several:
        families.append(built.part("agent_cmds", AgentCommands(router, replies)))
    if agents.skills.any:
        families.append(built.part("skill_cmds", SkillCommands(store, replies, agents.skills)))
    families.append(built.part("link_cmds", LinkCommands(replies, storage.engine)))  # /link, /unlink
    families.append(handoffs)  # /handoff
    families.append(
        built.part("usage_cmds", UsageCommands(storage.engine, usage.settings, replies))
    )  # /usage
    for family in families:
        for command in family.commands():
            registry.add(command)
