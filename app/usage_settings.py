"""Usage, cost and budgets as configured (`USAGE_*` in `app.config.Settings`; docs/usage.md)."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelPrice(BaseModel):
    """An operator's own price of a model, per million tokens, in USAGE_CURRENCY (and, for
    a speech-to-text model billed by duration, per minute of audio)."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)
    cached: float | None = Field(None, ge=0, description="Cached input tokens; default: the input price.")
    audio_minute: float | None = Field(None, ge=0, description="Speech to text, per minute of audio.")


class Budget(BaseModel):
    """A limit for every subject of a scope: each sender, each chat, each agent, or the
    whole deployment, per UTC day or month, in tokens or in currency."""

    model_config = ConfigDict(extra="forbid")

    scope: Literal["sender", "chat", "agent", "deployment"]
    period: Literal["day", "month"]
    tokens: int | None = Field(None, ge=1)
    cost: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_limit(self) -> Budget:
        if (self.tokens is None) == (self.cost is None):
            raise ValueError("a budget has `tokens` or `cost`, not both")
        return self


def json_setting(value: object, empty: Any) -> object:
    """A setting given as JSON text (the environment) or already parsed (code, tests)."""
    if isinstance(value, str):
        return json.loads(value) if value.strip() else empty
    return value


class UsageSettings(BaseModel):
    currency: str = "USD"
    prices: dict[str, ModelPrice] = Field(default_factory=dict)
    budgets: list[Budget] = Field(default_factory=list)

    @classmethod
    def from_settings(cls, settings: Any) -> UsageSettings:
        return cls(
            currency=settings.usage_currency, prices=settings.usage_prices, budgets=settings.usage_budgets
        )
