"""/agent: list the agents a sender may use, or switch this chat to one (`AgentRouter.choose`)."""

from __future__ import annotations

from app.agents.profiles import AgentRouter
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies
from app.pipeline.texts import say


class AgentCommands:
    def __init__(self, agents: AgentRouter, replies: Replies) -> None:
        self.agents = agents
        self.replies = replies

    def commands(self) -> list[Command]:
        return [
            Command(
                "/agent",
                {
                    "en": "List the agents, or switch this chat to one.",
                    "zh": "列出智能体，或将此聊天切换到某个智能体。",
                },
                self.agent,
                usage="[NAME]",
            )
        ]

    async def agent(self, call: CommandCall) -> None:
        book, event = self.agents.book, call.event
        usable = book.usable(event.sender_id)
        current = self.agents.agent_of(event).name
        name = call.args.strip()
        if not name:
            lines = [say("agent.title", call.locale)]
            for agent in usable:
                mark = " *" if agent.name == current else ""
                lines.append(
                    f"- {agent.name}" + (f" — {agent.description}" if agent.description else "") + mark
                )
            await self.replies.answer(call.lease, call.row, "\n".join(lines))
            return
        if name not in {a.name for a in usable}:
            names = ", ".join(a.name for a in usable)
            text = say("agent.unknown", call.locale, agent=name, agents=names)
            await self.replies.answer(call.lease, call.row, text)
            return
        await self.agents.choose(event, name)
        await self.replies.answer(call.lease, call.row, say("agent.switched", call.locale, agent=name))
