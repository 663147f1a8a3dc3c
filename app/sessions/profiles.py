"""What serves a session: the profile of its agent, and the one rule for its model.

The turn (model, tools, approvers, context size) and memory (namespace) ask a
`SessionProfiles`; `app.agents.profiles.AgentRouter` is the one the gateway builds, from
the agents file. Without agents, `NoProfiles` says "nothing of the agent's own".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from app.events import InboundEvent
from app.sessions.store import SessionState

MODEL = "model"  # the session metadata `/model` writes


class SessionProfiles(Protocol):
    """The serving agent's settings for a session (by its event, or by its key)."""

    def model_of(self, event: InboundEvent) -> str | None:
        """The agent's model (None: not the agent's to say)."""
        ...

    def tools_of(self, key: str) -> tuple[Sequence[str], Sequence[str]]:
        """The agent's tool lists (allow, deny); empty: the gateway's policy alone."""
        ...

    def approvers_of(self, key: str) -> Sequence[str]:
        """Who may decide the agent's approvals; empty: the channel's rules."""
        ...

    def context_tokens_of(self, event: InboundEvent) -> Mapping[str, int]:
        """The agent's context sizes by model (over `LLM_CONTEXT_TOKENS_BY_MODEL`)."""
        ...

    def namespace_of(self, key: str) -> str:
        """The agent's memory namespace ("" by default)."""
        ...


class NoProfiles:
    """`SessionProfiles` of a gateway without agents."""

    def model_of(self, event: InboundEvent) -> str | None:
        return None

    def tools_of(self, key: str) -> tuple[Sequence[str], Sequence[str]]:
        return (), ()

    def approvers_of(self, key: str) -> Sequence[str]:
        return ()

    def context_tokens_of(self, event: InboundEvent) -> Mapping[str, int]:
        return {}

    def namespace_of(self, key: str) -> str:
        return ""


class SessionModels:
    """Which model serves a session — the one place that decides it.

    `/model`'s choice stored on the session, else the serving agent's model, else the
    channel's (`<CHANNEL>_LLM_MODEL`); None means the provider's own default, `LLM_MODEL`
    (`default`), which is what `shown` names to people.
    """

    def __init__(
        self,
        profiles: SessionProfiles,
        channel_models: Mapping[str, str | None],
        *,
        default: str,
        allowed: Sequence[str] = (),
    ) -> None:
        self.profiles = profiles
        self.channel_models = dict(channel_models)
        self.default = default
        self.allowed = list(allowed)  # LLM_MODELS: what `/model` may choose when the agent names none

    def base(self, event: InboundEvent) -> str | None:
        """The model before `/model`: the agent's, else the channel's (None: the default)."""
        return self.profiles.model_of(event) or self.channel_models.get(event.channel)

    def of(self, session: SessionState, event: InboundEvent) -> str | None:
        """The model a turn of `session` asks for (None: the provider's default)."""
        chosen = session.metadata.get(MODEL)
        return chosen if isinstance(chosen, str) and chosen else self.base(event)

    def shown(self, session: SessionState, event: InboundEvent) -> str:
        """The model serving `session`, by name."""
        return self.of(session, event) or self.default

    def choices(self, event: InboundEvent, agent_models: Sequence[str] = ()) -> list[str]:
        """What `/model` may choose: the base model first, then the agent's (else LLM_MODELS)."""
        first = self.base(event) or self.default
        return [first, *(m for m in (agent_models or self.allowed) if m != first)]
