"""Settings of the MCP server (`MCP_SERVER_…`; `MCP_SERVERS` are the servers chatgate uses)."""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from app.channel import ChannelSettings
from app.config import GatewayTokenSpec
from app.events import BusyPolicy, SessionScope


class McpServerSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="MCP_SERVER_", env_file=".env", extra="ignore")

    # A risky tool in an `ask` turn waits for /approve only when the asking caller is in
    # `approvers` (MCP_SERVER_APPROVERS); anyone else's call is refused at once.
    approvers_ask_only_for_themselves: ClassVar[bool] = True

    session_scope: SessionScope = Field(
        SessionScope.THREAD, description="Always thread: `ask` sessions are mcp:<caller>:<session>."
    )
    busy_policy: BusyPolicy = Field(
        BusyPolicy.QUEUE,
        description="Always queue: each request waits for its own turn and answer "
        "(collect and steer would answer several requests with one reply).",
    )
    tokens: Annotated[list[GatewayTokenSpec], NoDecode] = Field(
        default_factory=list,
        description='Callers, JSON [{"token", "subject", "session_keys", "key_prefix"}] as GATEWAY_TOKENS: '
        "subject names the caller; the keys and prefix are the sessions it may list, read and "
        "send to (its own `ask` sessions always). The server is served when set.",
    )
    wait_max_seconds: float = Field(120.0, gt=0, description="How long `ask` waits for the answer.")
    max_text_chars: int = Field(32_000, description="Longer `ask` and `send_message` texts are refused.")
    max_history: int = Field(200, description="Messages `get_history` returns at most.")

    @field_validator("tokens", mode="before")
    @classmethod
    def _json(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value) if value.strip() else []
            except ValueError as exc:  # not quoted: the value holds tokens
                raise ValueError("MCP_SERVER_TOKENS is not valid JSON") from exc
        return value

    @field_validator("tokens")
    @classmethod
    def _unique(cls, value: list[GatewayTokenSpec]) -> list[GatewayTokenSpec]:
        if len({spec.token for spec in value}) != len(value):
            raise ValueError("MCP_SERVER_TOKENS: each token once")
        return value

    @field_validator("busy_policy")
    @classmethod
    def _own_answer_per_request(cls, value: BusyPolicy) -> BusyPolicy:
        if value is not BusyPolicy.QUEUE:
            raise ValueError("MCP_SERVER_BUSY_POLICY must be queue: each request waits for its own answer")
        return value
