"""Outbound side of the browser gateway.

Browser clients see a session through the session bus, not through this adapter: every
history message is pushed to them as it is committed. So `send` only has to hand the
few replies that are *not* history messages (answers to `/new`, `/reset`, "could not
process") to whoever listens (`outbound_sink`, installed by the gateway), and report
success so that the outbox row is marked sent instead of waiting forever.

Inbound events are produced by the gateway (`app.gateway`), which checks the token's
scope before it sets `session_key_override`; that is why this channel honours overrides
by default while every other channel does not.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from pydantic import Field, field_validator
from pydantic_settings import SettingsConfigDict

from app.channel import ChannelContext, ChannelSettings, SendResult
from app.events import OutboundMessage

OutboundSink = Callable[[OutboundMessage], Awaitable[None]]


class BrowserSettings(ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="BROWSER_", env_file=".env", extra="ignore")

    allow_session_override: bool = Field(
        True, description="Always true: the gateway attaches events to the key the token allowed."
    )

    @field_validator("allow_session_override")
    @classmethod
    def _always_override(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "the browser channel needs session overrides: its events go to the session key the "
                "gateway checked against the token, not to a key built from chat ids"
            )
        return value


class BrowserChannel:
    name = "browser"

    def __init__(self, settings: BrowserSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.outbound_sink: OutboundSink | None = None

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        self.outbound_sink = None

    async def send(self, message: OutboundMessage) -> SendResult:
        """Delivered through the session bus; nothing can fail here, so never retry."""
        if self.outbound_sink is not None:
            await self.outbound_sink(message)
        return SendResult(platform_message_id=None)
