"""The gateway of one app instance: token checks, open connections, outbound notices."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import structlog

from app.bus import SessionBus
from app.channel import AcceptResult
from app.events import InboundEvent, OutboundMessage
from app.gateway import history
from app.gateway.connection import GatewayConnection, GatewaySocket
from app.gateway.protocol import CloseCode
from app.gateway.ratelimit import SubjectRates
from app.gateway.tokens import TokenVerifier
from app.runtime import Runtime

log = structlog.get_logger(__name__)

CHANNEL = "browser"


class GatewayHub:
    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.settings = runtime.settings
        self.metrics = runtime.metrics
        self.engine = runtime.engine
        self.verifier = TokenVerifier(self.settings.gateway_tokens, self.settings.gateway_token_secret)
        self.subject_rates = SubjectRates(self.settings.gateway_subject_sends_per_minute)
        self.connections: set[GatewayConnection] = set()

    @property
    def bus(self) -> SessionBus:
        return self.runtime.bus

    @property
    def available(self) -> bool:
        return CHANNEL in self.runtime.adapters

    async def start(self) -> None:
        """Called once the runtime started: route the browser channel's replies here."""
        adapter = self.runtime.adapters.get(CHANNEL)
        if adapter is not None and hasattr(adapter, "outbound_sink"):
            adapter.outbound_sink = self.deliver_notice

    async def stop(self) -> None:
        await asyncio.gather(
            *(c.close(CloseCode.GOING_AWAY) for c in list(self.connections)), return_exceptions=True
        )

    async def serve(self, ws: GatewaySocket) -> None:
        connection = GatewayConnection(self, ws)
        self.connections.add(connection)
        self.metrics.ws_connections.inc()
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            self.metrics.ws_connections.dec()
            reason = (
                "client" if connection.close_code is None else CloseCode(connection.close_code).name.lower()
            )
            self.metrics.ws_closed.labels(reason).inc()

    async def accept(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        """Into the inbox like every channel's events (sender policy, dedup, metrics)."""
        return await self.runtime.ingest.accept(CHANNEL, events)

    async def deliver_notice(self, message: OutboundMessage) -> None:
        """A browser reply from the outbox.

        A reply linked to a run is history (the run's answer, a stop notice …): clients
        get it as a `message`. Some paths write history without publishing it, so ask the
        watchers to read what they miss from the database (`resync`, cheap: one indexed
        read per connection). Replies outside a run (answers to /new, /reset, failures)
        are not history: they go out as a `notice`.
        """
        key = message.session_key
        if not key:
            return
        run_id = None
        with contextlib.suppress(Exception):
            run_id = await history.outbox_run_id(self.engine, message.message_id)
        if run_id is not None:
            await self.bus.publish(key, {"type": "resync", "session_key": key})
            return
        await self.bus.publish(
            key,
            {
                "type": "notice",
                "session_key": key,
                "text": message.text,
                "in_reply_to_event": message.in_reply_to_event,
                "message_id": message.message_id,
            },
        )
