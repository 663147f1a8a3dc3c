"""What a gateway connection and its attached session need from the gateway and the socket."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from app.bus import SessionBus
    from app.channel import AcceptResult
    from app.config import Settings
    from app.events import InboundEvent
    from app.gateway.ratelimit import SubjectRates
    from app.gateway.tokens import TokenVerifier
    from app.metrics import Metrics


class TooSlow(Exception):
    """The client's send queue is full (or the connection is closing): stop producing."""


class GatewaySocket(Protocol):
    """The little a connection needs from a WebSocket (`app.api` adapts Starlette's)."""

    async def accept(self) -> None: ...

    async def receive_text(self) -> str | None:
        """The next text frame, or None once the peer is gone."""
        ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int, reason: str) -> None: ...


class GatewayHost(Protocol):
    """What a connection needs from the gateway it belongs to (`app.gateway.hub.GatewayHub`)."""

    settings: Settings
    engine: AsyncEngine
    metrics: Metrics
    verifier: TokenVerifier
    subject_rates: SubjectRates

    @property
    def bus(self) -> SessionBus: ...

    @property
    def available(self) -> bool: ...

    async def accept(self, events: Sequence[InboundEvent]) -> list[AcceptResult]: ...
