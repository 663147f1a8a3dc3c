"""The Agent Cards: the gateway's at `/.well-known/agent-card.json`, and with several agents
(`AGENTS_FILE`) one per agent at `/a2a/agents/<name>/.well-known/agent-card.json`, whose
JSON-RPC URL is `/a2a/agents/<name>`."""

from __future__ import annotations

from urllib.parse import quote

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import PROTOCOL_VERSION_CURRENT, TransportProtocol

from app.channel import AgentListing
from channels.a2a.settings import A2ASettings

RPC_PATH = "/a2a"
AGENTS_PATH = "/a2a/agents/"
SCHEME = "bearer"


def rpc_path(agent: AgentListing | None) -> str:
    """Where `agent` is called: the gateway's own URL for the default agent."""
    return RPC_PATH if agent is None or agent.default else AGENTS_PATH + quote(agent.name, safe="")


def _skills(agent: AgentListing | None) -> list[AgentSkill]:
    chat = AgentSkill(
        id="chat",
        name="Conversation",
        description="Talk to the agent; a contextId is one conversation of the calling agent.",
        tags=["chat", "tools"],
        examples=["What time is it?"],
    )
    loadable = [
        AgentSkill(id=f"skill:{name}", name=name, description=description or name, tags=["skill"])
        for name, description in (agent.skills if agent is not None else ())
    ]
    return [chat, *loadable]


def agent_card(
    settings: A2ASettings, base_url: str, *, push: bool = False, agent: AgentListing | None = None
) -> AgentCard:
    """The card for `base_url` (PUBLIC_BASE_URL, or the URL the card was asked for); with
    `agent`, that agent's card (its name, description and skills, its own JSON-RPC URL)."""
    named = agent is not None and not agent.default
    return AgentCard(
        name=agent.name if named and agent is not None else settings.agent_name,
        description=(agent.description if agent is not None and agent.description else None)
        or settings.agent_description,
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=base_url.rstrip("/") + rpc_path(agent),
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        security_schemes={
            SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    description="A bearer token the operator gave the calling agent; it names the caller.",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SCHEME: StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=_skills(agent),
    )
