"""WhatsApp Cloud API over its webhook (`GET`/`POST /channels/whatsapp`).

Inbound: `GET` is Meta's verification handshake (`hub.challenge` echoed when
`hub.verify_token` is ours); every `POST` is verified with `X-Hub-Signature-256` before
anything else. Messages become events keyed by the sender's `wa_id` (or the group),
deduplicated on the message id (`wamid`); images, documents and audio are fetched by
media id within `WHATSAPP_MEDIA_MAX_BYTES`. Each message moves its chat's
customer-service window (a channel record, so every replica sees it). Statuses of what
we sent are recorded: `failed` fails the outbox row with the platform's reason, the
latest status per recipient is kept as a record.

Outbound: `POST /{phone-number-id}/messages`, text split at 4,096 characters. Outside
the 24-hour window WhatsApp refuses free-form messages: the configured template (if
any) is sent instead, and the answer is recorded as not sent with the reason.
"""

from __future__ import annotations

import base64
import hmac
import time
from typing import Any

import structlog

from app.channel import ChannelContext, ChannelRequest, ChannelResponse, SendResult
from app.errors import (
    ChannelForbidden,
    ChannelNotConfigured,
    ChannelRejected,
)
from app.events import (
    APPROVAL_KEY,
    FilePart,
    ImagePart,
    InboundEvent,
    OutboundMessage,
)
from app.streaming.protocol import StreamingMode
from channels.common.chunks import ChunkProgress, split_text
from channels.common.media import (
    Media,
    MediaTooLarge,
    inline_media,
    tell_too_large,
)
from channels.common.progress import ProgressStreamer
from channels.whatsapp import signing
from channels.whatsapp.graph import GraphAPI, OutsideWindow, upload
from channels.whatsapp.native import MAX_BODY, approval_interactive, approval_title
from channels.whatsapp.parse import GROUP_PREFIX, MEDIA_PREFIX, Inbound, Status, parse
from channels.whatsapp.settings import WhatsAppSettings

log = structlog.get_logger(__name__)

WINDOW = "window"  # record per chat: {"last_inbound": unix seconds of the user's last message}
RECEIPT = "receipt"  # record per recipient: the latest status of what we sent them
TYPING_SECONDS = 20.0  # the indicator shows for up to 25 s or until the answer arrives


class WhatsAppChannel:
    name = "whatsapp"

    def __init__(self, settings: WhatsAppSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.graph = GraphAPI(context.http, context.fetcher, settings)
        self._progress = ChunkProgress(capacity=1000)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    # --- inbound -----------------------------------------------------------------------

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.path.strip("/") != "":
            return ChannelResponse.json({"error": "not_found", "detail": "/channels/whatsapp"}, 404)
        if request.method == "GET":
            return self._verification(request)
        if request.method != "POST":
            return ChannelResponse.json({"error": "method_not_allowed"}, 405)
        if not self.settings.app_secret:
            raise ChannelNotConfigured("WHATSAPP_APP_SECRET must be set on this server")
        signing.verify(self.settings.app_secret, request.headers.get(signing.SIGNATURE_HEADER), request.body)
        webhook = parse(
            request.json(),
            phone_number_id=self.settings.phone_number_id,
            scope=self.settings.session_scope,
            require_mention=self.settings.require_mention_in_groups,
        )
        events: list[InboundEvent] = []
        for inbound in webhook.messages:
            await self._open_window(inbound)
            event = await self._with_media(inbound.event)
            if event is not None:
                events.append(event)
        if events:
            await self.context.accept(events)
        for status in webhook.statuses:
            await self._record_status(status)
        return ChannelResponse.text("ok")

    def _verification(self, request: ChannelRequest) -> ChannelResponse:
        if not self.settings.verify_token:
            raise ChannelNotConfigured("WHATSAPP_VERIFY_TOKEN must be set on this server")
        mode, token = request.query.get("hub.mode"), request.query.get("hub.verify_token")
        challenge = request.query.get("hub.challenge")
        if mode != "subscribe" or token is None or challenge is None:
            raise ChannelForbidden("expected hub.mode=subscribe with hub.verify_token and hub.challenge")
        if not hmac.compare_digest(token.encode(), self.settings.verify_token.encode()):
            raise ChannelForbidden("hub.verify_token does not match WHATSAPP_VERIFY_TOKEN")
        return ChannelResponse.text(challenge)

    async def _open_window(self, inbound: Inbound) -> None:
        """Remember when the chat's user last wrote (before the event is accepted: a
        failure here makes the platform redeliver, and the window is never behind)."""
        records = self.context.records
        if records is None:
            return
        chat = inbound.event.chat_id
        # The message's own time (a redelivery days later must not reopen the window);
        # none given, or one in the future: now.
        now = time.time()
        sent_at = inbound.sent_at if 0 < inbound.sent_at <= now else now
        known = await records.get(WINDOW, chat)
        last = float(known.data.get("last_inbound", 0)) if known is not None else 0.0
        if sent_at > last:
            await records.put(WINDOW, chat, {"last_inbound": sent_at}, open=False)

    async def _record_status(self, status: Status) -> None:
        records = self.context.records
        if records is None:
            return
        if status.status == "failed":
            reason = f"WhatsApp reported the message failed: {status.error or 'no reason given'}"
            if not await records.delivery_failed(status.platform_message_id, reason):
                log.warning("whatsapp_failed_status_unmatched", wamid=status.platform_message_id)
        data = {"message_id": status.platform_message_id, "status": status.status, "at": time.time()}
        if status.error:
            data["error"] = status.error
        await records.put(RECEIPT, status.recipient or status.platform_message_id, data, open=False)

    async def _with_media(self, event: InboundEvent) -> InboundEvent | None:
        limit = self.settings.media_max_bytes

        async def fetch(part: ImagePart | FilePart) -> Media | None:
            if not part.url or not part.url.startswith(MEDIA_PREFIX):
                return None
            return await self.graph.media(part.url.removeprefix(MEDIA_PREFIX), limit)

        try:
            return await inline_media(
                event,
                fetch,
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await tell_too_large(self.send, event, self.settings.locale, exc.limit)
            return None

    # --- outbound ----------------------------------------------------------------------

    async def send(self, message: OutboundMessage) -> SendResult:
        target = _recipient(message.chat_id)
        closed = await self._window_closed(message.chat_id)
        if closed is not None:
            return await self._outside_window(message, target, closed)
        chunks = self._chunks(message)
        bodies: list[dict[str, Any]] = [
            {**target, "type": "text", "text": {"body": chunk}} for chunk in chunks
        ]
        if APPROVAL_KEY in message.metadata:
            # Approve / deny reply buttons: on the prompt's last message when it fits an
            # interactive body, else on a short message of their own after it.
            approval, locale = str(message.metadata[APPROVAL_KEY]), self.settings.locale
            if chunks and len(chunks[-1]) <= MAX_BODY:
                bodies[-1] = approval_interactive(target, chunks[-1], approval, locale)
            else:
                bodies.append(
                    approval_interactive(target, approval_title(approval, locale), approval, locale)
                )
        for part in message.parts:
            if isinstance(part, ImagePart | FilePart) and (part.url or part.data_base64):
                bodies.append(await self._media_body(target, part))
        sent: list[str | None] = []
        try:
            # A retry after a partial send starts at the body that failed (`ChunkProgress`).
            for index in range(self._progress.delivered(message.message_id), len(bodies)):
                sent.append(await self.graph.send(bodies[index]))
                self._progress.record(message.message_id, index + 1)
            self._progress.forget(message.message_id)
        except OutsideWindow as exc:  # the platform's clock says so; ours did not know yet
            return await self._outside_window(message, target, exc.detail)
        return SendResult(platform_message_id=next((s for s in reversed(sent) if s), None))

    def _chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(message.text, self.settings.max_text_chars) if message.text.strip() else []

    async def _window_closed(self, chat_id: str) -> str | None:
        """Why a free-form message may not go to `chat_id` now, or None."""
        records = self.context.records
        if records is None:
            return None
        known = await records.get(WINDOW, chat_id)
        if known is None:
            return "the user has not written to this number yet"
        last = float(known.data.get("last_inbound", 0))
        hours = (time.time() - last) / 3600
        if hours <= self.settings.window_hours:
            return None
        return f"the user last wrote {hours:.1f} hours ago"

    async def _outside_window(self, message: OutboundMessage, target: dict[str, str], why: str) -> SendResult:
        """Send the template if there is one; the answer itself is not sent (a failed row)."""
        name = self.settings.template_name
        reason = f"outside WhatsApp's {self.settings.window_hours:g}-hour customer-service window ({why})"
        if not name:
            raise ChannelRejected(f"{reason}: answer not sent; set WHATSAPP_TEMPLATE_NAME to send a template")
        template = {"name": name, "language": {"code": self.settings.template_language}}
        wamid = await self.graph.send({**target, "type": "template", "template": template})
        log.info("whatsapp_template_sent", chat_id=message.chat_id, template=name, wamid=wamid)
        raise ChannelRejected(f"{reason}: template {name!r} sent instead ({wamid}); the answer was not sent")

    async def _media_body(self, target: dict[str, str], part: ImagePart | FilePart) -> dict[str, Any]:
        kind = "image" if isinstance(part, ImagePart) else "document"
        media: dict[str, Any]
        if part.url:
            media = {"link": part.url}
        else:
            assert part.data_base64 is not None
            mime = part.mime_type or ("image/jpeg" if kind == "image" else "application/octet-stream")
            name = getattr(part, "name", None) or kind
            media = {"id": await upload(self.graph, base64.b64decode(part.data_base64), mime, name)}
        if isinstance(part, FilePart) and part.name:
            media["filename"] = part.name
        return {**target, "type": kind, kind: media}

    # --- progress (`app.streaming`) ---------------------------------------------------

    def streamer(self) -> ProgressStreamer | None:
        s = self.settings
        typing = s.streaming is StreamingMode.NATIVE
        if not typing and s.working_notice_seconds is None:
            return None
        return ProgressStreamer(
            self.send,
            locale=s.locale,
            notice_after=s.working_notice_seconds,
            show_typing=self._typing if typing else None,
            typing_every=TYPING_SECONDS,
        )

    async def _typing(self, message: OutboundMessage) -> None:
        """The typing indicator on the user's message (which it marks read as well)."""
        if not message.reply_to:
            return
        await self.graph.send(
            {"status": "read", "message_id": message.reply_to, "typing_indicator": {"type": "text"}}
        )


def _recipient(chat_id: str) -> dict[str, str]:
    if chat_id.startswith(GROUP_PREFIX):
        return {"recipient_type": "group", "to": chat_id.removeprefix(GROUP_PREFIX)}
    if not chat_id:
        raise ChannelRejected("no WhatsApp recipient")
    return {"recipient_type": "individual", "to": chat_id}
