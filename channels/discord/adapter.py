"""Discord channel: messages over the Gateway, slash commands over HTTP, replies over REST.

Inbound messages: the Gateway connection (discord.py) is opened only through
`ChannelContext.hold_connection("discord:<token fingerprint>")`, so one replica holds it.
Each MESSAGE_CREATE goes to the inbox (dedup on the message id).
Slash commands: `POST /channels/discord/interactions`, verified with Ed25519 over
`X-Signature-Timestamp + raw body` before anything is parsed; PING is answered with
PONG, a command is stored and answered "deferred" (type 5), and the turn's reply edits
that deferred answer through the interaction webhook.
Outbound: `POST /channels/{id}/messages` split at 2,000 characters; 429 → `retry_after`.
Images and files of a reply are uploaded as attachments (multipart `files[0]` +
`payload_json`), one outbox step each. Streaming (`DISCORD_STREAMING=edit`): a preview
sent, then edited in place (`channels.discord.stream`).
Inbound image attachments are downloaded from the CDN under `DISCORD_MEDIA_MAX_BYTES`.
"""

from __future__ import annotations

import time
from typing import Any

import httpx
import structlog
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.connections import HeldConnection, fingerprint
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRequestError,
    ChannelSendAuthError,
    DeliveryError,
    InvalidPayload,
)
from app.events import DELETE_KEY, PRIVATE_NOTICE_KEY, FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming.protocol import StreamingMode
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media, too_large_text
from channels.discord.native import (
    COMPONENT_APP_KEY,
    COMPONENT_TOKEN_KEY,
    EPHEMERAL,
    parse_component,
    parse_native,
)
from channels.discord.outbound import DiscordOutbound, UnknownMessage
from channels.discord.parse import parse_command, parse_message
from channels.discord.settings import DiscordSettings
from channels.discord.stream import DiscordStreamer

log = structlog.get_logger(__name__)

PING, APPLICATION_COMMAND, MESSAGE_COMPONENT = 1, 2, 3
PONG, DEFERRED_CHANNEL_MESSAGE, DEFERRED_UPDATE_MESSAGE = 1, 5, 6


class DiscordChannel:
    name = "discord"

    def __init__(self, settings: DiscordSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.bot_id: str | None = None
        self._key = _public_key(settings.public_key) if settings.public_key else None
        self._http = httpx.AsyncClient(
            base_url=settings.api_base.rstrip("/"), timeout=settings.request_timeout_seconds
        )
        self._holder: HeldConnection | None = None
        self._connection = "discord"  # the connection's name, once started
        # The platform calls every sender shares: replies here, previews in the streamer.
        self.outbound = DiscordOutbound(self._http, settings)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.settings.bot_token:
            log.warning("discord_not_configured", detail="DISCORD_BOT_TOKEN is not set")
            return
        if self.settings.gateway:
            name = self._connection = f"discord:{fingerprint(self.settings.bot_token)}"
            self._holder = HeldConnection(self.context.hold_connection, name, self._run_gateway)

    async def stop(self) -> None:
        if self._holder is not None:
            await self._holder.release()
            self._holder = None
        await self._http.aclose()

    # --- inbound: the Gateway -----------------------------------------------------------

    async def _run_gateway(self) -> None:
        from channels.discord.gateway import run_gateway

        await run_gateway(self)

    async def load_session(self) -> dict[str, Any] | None:
        """The Gateway session the last holder saved (`channels.discord.gateway`)."""
        return await self.context.connection_state.load_state(self._connection)

    async def save_session(self, session: dict[str, Any]) -> None:
        await self.context.connection_state.save_state(self._connection, session)

    async def on_message_create(self, data: dict[str, Any], parent_id: str | None) -> None:
        """A MESSAGE_CREATE from the Gateway (`parent_id`: the thread's parent channel)."""
        try:
            parsed = parse_message(data, self.settings, self.bot_id, parent_id=parent_id)
            if parsed.event is None:
                return
            event = await self._with_media(parsed.event)
            if event is not None:
                await self.context.accept([event])
        except ChannelRequestError as exc:
            log.warning("discord_message_refused", detail=exc.detail)

    async def on_native(self, kind: str, data: dict[str, Any], parent_id: str | None) -> None:
        """An edit, deletion or reaction from the Gateway (docs/events.md)."""
        try:
            event = parse_native(kind, data, self.settings, self.bot_id, parent_id=parent_id)
            if event is not None:
                await self.context.accept([event])
        except ChannelRequestError as exc:
            log.warning("discord_event_refused", detail=exc.detail)

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        """Image attachments (and, with speech to text, audio; with kept files, every
        attachment) downloaded from the CDN (signed URLs, no token sent); None when one is
        too large (after a polite reply)."""
        limit = self.settings.media_max_bytes
        cdn = self.settings.cdn_base

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not (part.url or "").startswith(cdn):
                return None
            assert part.url is not None
            return await download_capped(self.context.fetcher, part.url, limit, trusted=[cdn])

        try:
            return await inline_media(
                event,
                fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,  # every attachment, kept in the session's workspace
            )
        except MediaTooLarge:
            channel_id = str(event.metadata.get("reply_channel_id") or event.chat_id)
            try:
                await self.outbound.post(channel_id, too_large_text(self.settings.locale, limit))
            except DeliveryError as exc:  # best-effort: the message is not stored either way
                log.warning("discord_too_large_reply_failed", error=exc.detail)
            return None

    # --- inbound: interactions ----------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.method != "POST" or request.path.strip("/") != "interactions":
            return ChannelResponse.json(
                {"error": "not_found", "detail": "POST /channels/discord/interactions"}, 404
            )
        self._verify(request)
        payload = request.json()
        if not isinstance(payload, dict):
            raise InvalidPayload("interaction body is not a JSON object")
        kind = payload.get("type")
        if kind == PING:
            return ChannelResponse.json({"type": PONG})
        if kind == MESSAGE_COMPONENT:  # a press on an approval prompt's button (docs/events.md)
            press = parse_component(payload, self.settings)
            if press is not None:
                await self.context.accept([press])
            # Acknowledged, the message left as it is: what the press decides comes as a
            # reply, a refusal as an ephemeral follow-up (`send`).
            return ChannelResponse.json({"type": DEFERRED_UPDATE_MESSAGE})
        if kind != APPLICATION_COMMAND:
            raise InvalidPayload(f"unsupported interaction type {kind!r}")
        await self.context.accept([parse_command(payload, self.settings)])
        # The turn's reply edits this deferred answer (`send`); a duplicate is deferred again.
        return ChannelResponse.json({"type": DEFERRED_CHANNEL_MESSAGE})

    def _verify(self, request: ChannelRequest) -> None:
        if self._key is None:
            raise ChannelNotConfigured("DISCORD_PUBLIC_KEY is not set on this server")
        signature = request.headers.get("x-signature-ed25519")
        timestamp = request.headers.get("x-signature-timestamp")
        if not signature or not timestamp:
            raise ChannelAuthError("missing X-Signature-Ed25519 or X-Signature-Timestamp header")
        try:
            self._key.verify(bytes.fromhex(signature), timestamp.encode() + request.body)
        except (ValueError, InvalidSignature) as exc:
            raise ChannelAuthError("X-Signature-Ed25519 does not verify") from exc
        try:
            skew = abs(time.time() - float(timestamp))
        except ValueError as exc:
            raise ChannelAuthError("X-Signature-Timestamp is not a number") from exc
        if skew > self.settings.timestamp_tolerance_seconds:
            raise ChannelAuthError("X-Signature-Timestamp is too far from now")

    # --- outbound -----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        if DELETE_KEY in message.metadata:  # our answer to a deleted message (docs/events.md)
            channel_id = str(message.metadata.get("reply_channel_id") or message.chat_id)
            try:
                await self.outbound.call(
                    "DELETE", f"/channels/{channel_id}/messages/{message.metadata[DELETE_KEY]}", None
                )
            except UnknownMessage:  # already gone
                pass
            return SendResult()
        token, app_id = message.metadata.get(COMPONENT_TOKEN_KEY), message.metadata.get(COMPONENT_APP_KEY)
        if message.metadata.get(PRIVATE_NOTICE_KEY) and token and app_id:
            # A refused press: an ephemeral follow-up only the presser sees (within 15 minutes).
            body = {"content": message.text[: self.settings.max_message_chars], "flags": EPHEMERAL}
            await self.outbound.call("POST", f"/webhooks/{app_id}/{token}", body, auth=False)
            return SendResult()
        if not self.settings.bot_token:
            raise ChannelSendAuthError("DISCORD_BOT_TOKEN is not set", retryable=False)
        return await self.outbound.send(message)

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> DiscordStreamer | None:
        if not self.settings.bot_token or self.settings.streaming is StreamingMode.OFF:
            return None
        return DiscordStreamer(self.outbound, self.settings)


def _public_key(value: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value))
    except ValueError as exc:
        raise ValueError("DISCORD_PUBLIC_KEY must be the application's 32-byte public key in hex") from exc
