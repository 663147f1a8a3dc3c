"""The Agent Card served at `/.well-known/agent-card.json`."""

from __future__ import annotations

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

from channels.a2a.settings import A2ASettings

RPC_PATH = "/a2a"
SCHEME = "bearer"


def agent_card(settings: A2ASettings, base_url: str, *, push: bool = False) -> AgentCard:
    """The card for `base_url` (PUBLIC_BASE_URL, or the URL the card was asked for)."""
    return AgentCard(
        name=settings.agent_name,
        description=settings.agent_description,
        version="1.0.0",
        supported_interfaces=[
            AgentInterface(
                url=base_url.rstrip("/") + RPC_PATH,
                protocol_binding=TransportProtocol.JSONRPC.value,
                protocol_version=PROTOCOL_VERSION_CURRENT,
            )
        ],
        capabilities=AgentCapabilities(streaming=True, push_notifications=push),
        security_schemes={
            SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer", description="A token from A2A_TOKENS; it names the caller."
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SCHEME: StringList()})],
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(
                id="chat",
                name="Conversation",
                description="Talk to the agent; a contextId is one conversation of the calling agent.",
                tags=["chat", "tools"],
                examples=["What time is it?"],
            )
        ],
    )
