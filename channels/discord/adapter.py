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

import asyncio
import base64
import contextlib
import hashlib
import json
import time
from typing import Any

import httpx
import structlog
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.connections import fingerprint
from app.errors import (
    ChannelAuthError,
    ChannelNotConfigured,
    ChannelRateLimited,
    ChannelRejected,
    ChannelRequestError,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
    InvalidPayload,
)
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage
from app.streaming import StreamingMode
from channels.common.chunks import ChunkProgress, send_chunks, split_text
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media, too_large_text
from channels.discord.outbound import UnknownMessage, attachment_name, uploads
from channels.discord.parse import parse_command, parse_message
from channels.discord.settings import DiscordSettings
from channels.discord.stream import DiscordStreamer

log = structlog.get_logger(__name__)

PING, APPLICATION_COMMAND = 1, 2
PONG, DEFERRED_CHANNEL_MESSAGE = 1, 5


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
        self._holder: asyncio.Future[None] | None = None
        self._connection = "discord"  # the connection's name, once started
        self._progress = ChunkProgress(capacity=1000)

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.settings.bot_token:
            log.warning("discord_not_configured", detail="DISCORD_BOT_TOKEN is not set")
            return
        if self.settings.gateway:
            name = self._connection = f"discord:{fingerprint(self.settings.bot_token)}"
            self._holder = asyncio.ensure_future(self.context.hold_connection(name, self._run_gateway))

    async def stop(self) -> None:
        if self._holder is not None:
            self._holder.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._holder
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
            return await download_capped(self.context.http, part.url, limit)

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
                await self._call(
                    "POST",
                    f"/channels/{channel_id}/messages",
                    {"content": too_large_text(self.settings.locale, limit)},
                )
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
        if not self.settings.bot_token:
            raise ChannelSendAuthError("DISCORD_BOT_TOKEN is not set", retryable=False)
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = uploads(message)
        if not chunks and not media:
            return SendResult()

        async def deliver(index: int, _item: str) -> str:
            return await self.deliver_step(message, index, chunks, media)

        items = [*chunks, *(f"file:{i}" for i in range(len(media)))]
        sent = await send_chunks(self._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=next((m for m in sent if m), None))

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str:
        """One step of a reply: text chunk `index`, or (after the text) one upload."""
        meta = message.metadata
        token, app_id = meta.get("reply_interaction_token"), meta.get("reply_application_id")
        channel_id = meta.get("reply_channel_id") or message.thread_id or message.chat_id
        part = media[index - len(chunks)] if index >= len(chunks) else None
        body: dict[str, Any] = {} if part is not None else {"content": chunks[index]}
        if token and app_id:
            if index == 0 and part is None:  # the deferred answer ("thinking…") becomes the reply
                path = f"/webhooks/{app_id}/{token}/messages/@original"
                return await self._call("PATCH", path, body, auth=False)
            return await self._call("POST", f"/webhooks/{app_id}/{token}", body, auth=False, upload=part)
        # A nonce Discord enforces: a retry after a lost answer (or by another replica
        # after a crash) returns the message already created instead of a second one.
        body.update(nonce=_nonce(message.message_id, index), enforce_nonce=True)
        return await self._call("POST", f"/channels/{channel_id}/messages", body, upload=part)

    async def _call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        *,
        auth: bool = True,
        upload: ImagePart | FilePart | None = None,
    ) -> str:
        headers = {"Authorization": f"Bot {self.settings.bot_token}"} if auth else {}
        try:
            if upload is not None:  # an attachment: multipart, the JSON body as payload_json
                name = attachment_name(upload)
                payload = {**(body or {}), "attachments": [{"id": 0, "filename": name}]}
                assert upload.data_base64 is not None
                files = {
                    "files[0]": (
                        name,
                        base64.b64decode(upload.data_base64),
                        upload.mime_type or "application/octet-stream",
                    )
                }
                resp = await self._http.request(
                    method, path, data={"payload_json": json.dumps(payload)}, files=files, headers=headers
                )
            else:
                resp = await self._http.request(method, path, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"Discord unreachable: {exc!r}") from exc
        if resp.status_code == 429:
            raise ChannelRateLimited(_retry_after(resp), "Discord rate limit (429)")
        if resp.status_code in (401, 403) and auth:
            raise ChannelSendAuthError(f"Discord refused the bot token: {resp.status_code}")
        if resp.status_code >= 500:
            raise ChannelUnavailable(f"Discord answered {resp.status_code}")
        if resp.status_code == 404:
            raise UnknownMessage(f"Discord: not found (404) {resp.text[:200]}")
        if resp.status_code >= 400:
            raise ChannelRejected(f"Discord rejected the message: {resp.status_code} {resp.text[:200]}")
        data = resp.json() if resp.content else {}
        return str(data.get("id") or "") if isinstance(data, dict) else ""

    # --- streaming (`app.streaming`) ------------------------------------------------------

    def streamer(self) -> DiscordStreamer | None:
        if not self.settings.bot_token or self.settings.streaming is StreamingMode.OFF:
            return None
        return DiscordStreamer(self)


def _nonce(message_id: str, index: int) -> str:
    """At most 25 characters (Discord's limit), stable per outbox message and chunk."""
    return hashlib.sha256(f"{message_id}:{index}".encode()).hexdigest()[:25]


def _public_key(value: str) -> Ed25519PublicKey:
    try:
        return Ed25519PublicKey.from_public_bytes(bytes.fromhex(value))
    except ValueError as exc:
        raise ValueError("DISCORD_PUBLIC_KEY must be the application's 32-byte public key in hex") from exc


def _retry_after(resp: httpx.Response) -> float:
    """Seconds from the 429 body's `retry_after` (Discord), else the Retry-After header."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        return max(0.0, float(resp.json()["retry_after"]))
    with contextlib.suppress(ValueError, TypeError):
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    return 1.0
