"""A2A settings (`A2A_…`): callers and their tokens, the card, the turn cap."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from app.channel import ChannelSettings
from app.events import SessionScope


class A2ASettings(ChannelSettings):
    # Errors never show what was given: A2A_TOKENS holds the callers' secrets.
    model_config = SettingsConfigDict(
        env_prefix="A2A_", env_file=".env", extra="ignore", hide_input_in_errors=True
    )

    session_scope: SessionScope = Field(
        SessionScope.THREAD, description="Always thread: the key is a2a:<caller>:<contextId>."
    )
    tokens: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='Callers: JSON {"<token>": "<caller name>"} or token=caller,token=caller.',
    )
    public_base_url: str | None = Field(
        None,
        validation_alias=AliasChoices("A2A_PUBLIC_BASE_URL", "PUBLIC_BASE_URL"),
        description="Base of the card's URLs; PUBLIC_BASE_URL when unset, else the request's.",
    )
    agent_name: str = Field("chatgate", description="Name on the Agent Card.")
    agent_description: str = Field(
        "A chatgate agent: a conversation with tools, one session per caller and contextId.",
        description="Description on the Agent Card.",
    )
    max_turns_per_context: int = Field(
        100, description="Messages one caller may send in one contextId (bounds agent loops)."
    )
    wait_max_seconds: float = Field(60.0, description="How long a blocking message/send waits.")
    stream_max_seconds: float = Field(300.0, description="How long message/stream follows a task.")
    max_text_chars: int = Field(32_000, description="Longer messages are refused.")
    push_secret: str | None = Field(
        None,
        description="Signs push notifications like webhook callbacks (X-Chatgate-Signature); "
        "push notifications are offered only when set.",
    )
    push_allow_private_urls: bool = Field(
        False, description="Allow push URLs on loopback/private addresses (tests, one host)."
    )
    push_poll_seconds: float = Field(0.5, description="How often task states are checked for push.")
    push_max_configs_per_task: int = Field(10, description="Push configs one task may have.")

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = value.strip()
        if not value:
            return {}
        if value.startswith("{"):
            try:
                parsed = json.loads(value)
            except ValueError:
                raise ValueError("A2A_TOKENS is not valid JSON") from None
            # Checked here, so no error names a token (a dict key) in its location.
            if not isinstance(parsed, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in parsed.items()
            ):
                raise ValueError('A2A_TOKENS as JSON is {"<token>": "<caller name>"}, strings only')
            return parsed
        pairs = {}
        for item in value.split(","):
            token, sep, caller = item.strip().partition("=")
            if not sep or not token.strip() or not caller.strip():
                raise ValueError("A2A_TOKENS items are token=caller")
            pairs[token.strip()] = caller.strip()
        return pairs

    @field_validator("tokens")
    @classmethod
    def _callers_named(cls, value: dict[str, str]) -> dict[str, str]:
        for token, caller in value.items():
            if len(token) < 16:
                raise ValueError("A2A_TOKENS: each token needs at least 16 characters")
            if not caller or len(caller) > 100:
                raise ValueError("A2A_TOKENS: caller names are 1 to 100 characters")
        return value
