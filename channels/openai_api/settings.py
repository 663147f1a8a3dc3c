"""Settings of the OpenAI-compatible API (`OPENAI_API_…`).

The channel is named `openai` (its session keys are `openai:<caller>:<session>`), but its
settings are prefixed `OPENAI_API_`: a bare `OPENAI_` prefix would read variables that
OpenAI's own tools set in the same environment (`OPENAI_API_KEY`, `OPENAI_BASE_URL`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from app.channel import ChannelSettings
from app.events import BusyPolicy, SessionScope


def parse_tokens(value: Any, setting: str) -> Any:
    """`{"<token>": "<caller>"}` as JSON, or `token=caller,token=caller`."""
    if not isinstance(value, str):
        return value
    value = value.strip()
    if not value:
        return {}
    if value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError as exc:  # the message must not quote the value: it holds tokens
            raise ValueError(f"{setting} is not valid JSON") from exc
    pairs = {}
    for item in value.split(","):
        token, sep, caller = item.strip().partition("=")
        if not sep or not token.strip() or not caller.strip():
            raise ValueError(f"{setting} items are token=caller")
        pairs[token.strip()] = caller.strip()
    return pairs


def check_tokens(value: dict[str, str], setting: str) -> dict[str, str]:
    for token, caller in value.items():
        if len(token) < 16:
            raise ValueError(f"{setting}: each token needs at least 16 characters")
        if not caller or len(caller) > 100:
            raise ValueError(f"{setting}: caller names are 1 to 100 characters")
    return value


class OpenAIApiSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="OPENAI_API_", env_file=".env", extra="ignore")

    # A risky tool waits for /approve only in a turn of a caller listed in `approvers`
    # (OPENAI_API_APPROVERS: caller names); every other caller's call is refused at once,
    # so no request hangs on an approval nobody will give (app.pipeline.approvals).
    approvers_ask_only_for_themselves: ClassVar[bool] = True

    session_scope: SessionScope = Field(
        SessionScope.THREAD, description="Always thread: the key is openai:<caller>:<session id>."
    )
    busy_policy: BusyPolicy = Field(
        BusyPolicy.QUEUE,
        description="Always queue: each request waits for its own turn and answer "
        "(collect and steer would answer several requests with one reply).",
    )
    tokens: Annotated[dict[str, str], NoDecode] = Field(
        default_factory=dict,
        description='Callers: JSON {"<token>": "<caller name>"} or token=caller,token=caller; '
        "the API is served when set.",
    )
    wait_max_seconds: float = Field(
        120.0,
        gt=0,
        description="How long a completion waits for its turn and answer (a busy session "
        "queues); then 504, and the same Idempotency-Key fetches the answer later.",
    )
    max_text_chars: int = Field(32_000, description="Longer requests (all message text) get 400.")
    max_messages: int = Field(200, description="More messages in one request get 400.")

    @field_validator("tokens", mode="before")
    @classmethod
    def _tokens(cls, value: Any) -> Any:
        return parse_tokens(value, "OPENAI_API_TOKENS")

    @field_validator("tokens")
    @classmethod
    def _callers_named(cls, value: dict[str, str]) -> dict[str, str]:
        return check_tokens(value, "OPENAI_API_TOKENS")

    @field_validator("busy_policy")
    @classmethod
    def _own_answer_per_request(cls, value: BusyPolicy) -> BusyPolicy:
        if value is not BusyPolicy.QUEUE:
            raise ValueError("OPENAI_API_BUSY_POLICY must be queue: each request waits for its own answer")
        return value
