"""Streamed replies on Feishu as a streaming card (CardKit, `FEISHU_STREAMING=native`).

A card entity is created with one markdown element in streaming mode
(`POST /open-apis/cardkit/v1/cards`, card JSON 2.0), sent as an interactive message that
references it (`{"type": "card", "data": {"card_id": …}}`), and its text replaced with the
current view (`PUT /open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content`;
Feishu prints the new part with a typewriter effect). The answer is the element's last
content, then streaming mode is closed (`PATCH /open-apis/cardkit/v1/cards/{card_id}/settings`,
`streaming_mode: false`), so the card stops showing "generating".

Every card operation carries a `sequence` that must grow. It is the milliseconds since the
card was opened (kept in the preview id), so a process that took over after a crash goes
on counting above the dead one's numbers.

Feishu closes streaming mode by itself after 10 minutes; previews stop after
`FEISHU_CARD_STREAMING_SECONDS`, and an answer that finds streaming closed (too late, or
closed by an earlier attempt of the same delivery) replaces the whole card
(`PUT /open-apis/cardkit/v1/cards/{card_id}`). A card that cannot be updated at all is
recalled and the answer sent as a new message: replaced, not left half.

When Feishu refuses to create the card (the app lacks the `cardkit:card:write` scope, for
instance), the preview is a text message edited in place, as in `edit` mode
(`channels.feishu.stream`); its preview id is the message id, not a `card:` id.

lark-oapi has these calls (`cardkit.v1`), but its client blocks the event loop (see
`channels.feishu.api`); the requests are made through `FeishuApi` with the same paths and
bodies.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

from app.channel import SendResult
from app.errors import ChannelRejected, ChannelSendAuthError, DeliveryError
from app.events import OutboundMessage
from channels.common.chunks import split_text
from channels.common.steps import held_media
from channels.common.wechat_api import outbound_text

if TYPE_CHECKING:
    from channels.feishu.outbound import FeishuOutbound
    from channels.feishu.settings import FeishuSettings
    from channels.feishu.stream import FeishuStreamer

log = structlog.get_logger(__name__)

CARDS_PATH = "/open-apis/cardkit/v1/cards"
ELEMENT_ID = "answer"
PREFIX = "card:"
# A card's JSON may not exceed 30 KB: the answer's first part goes into the card, the rest
# follows as text messages.
CARD_TEXT_BYTES = 24_000
_REMEMBERED = 1000


@dataclass(frozen=True)
class CardPreview:
    """What a card preview id holds: `card:<card_id>:<opened, epoch ms>:<message_id>`."""

    card_id: str
    opened_ms: int
    message_id: str

    @property
    def preview_id(self) -> str:
        return f"{PREFIX}{self.card_id}:{self.opened_ms}:{self.message_id}"

    @classmethod
    def parse(cls, preview_id: str) -> CardPreview | None:
        if not preview_id.startswith(PREFIX):
            return None
        card_id, _, rest = preview_id[len(PREFIX) :].partition(":")
        opened, _, message_id = rest.partition(":")
        if not card_id or not opened.isdigit():
            return None
        return cls(card_id, int(opened), message_id)

    def age(self) -> float:
        return time.time() - self.opened_ms / 1000


def card_json(text: str, *, streaming: bool) -> dict[str, Any]:
    """A card JSON 2.0 with the answer as its one markdown element."""
    return {
        "schema": "2.0",
        "config": {"streaming_mode": streaming, "update_multi": True},
        "body": {"elements": [{"tag": "markdown", "element_id": ELEMENT_ID, "content": text}]},
    }


class FeishuCardStreamer:
    def __init__(
        self, outbound: FeishuOutbound, settings: FeishuSettings, text_previews: FeishuStreamer
    ) -> None:
        self.outbound = outbound
        self.text_previews = text_previews
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = CARD_TEXT_BYTES // 3  # Chinese: three bytes a character
        self.streaming_seconds = settings.card_streaming_seconds
        self._sequences: OrderedDict[str, int] = OrderedDict()  # card id -> last sequence used

    def edits_card(self, preview_id: str) -> bool:
        """A card preview's edits are CardKit calls (`app.streaming.protocol.CardEdits`),
        paced by `feishu.card` when set; a text preview (the fallback) edits a message."""
        return preview_id.startswith(PREFIX)

    async def typing(self, message: OutboundMessage) -> None:
        return None

    async def open(self, message: OutboundMessage) -> str:
        api = self.outbound.api
        try:
            created = await api.post(
                CARDS_PATH,
                {
                    "type": "card_json",
                    "data": json.dumps(card_json(message.text, streaming=True), ensure_ascii=False),
                },
            )
        except (ChannelRejected, ChannelSendAuthError) as exc:
            log.warning("feishu_card_refused", error=exc.detail)
            return await self.text_previews.open(message)
        card_id = created.get("card_id") if isinstance(created, dict) else None
        if not isinstance(card_id, str) or not card_id:
            raise ChannelRejected(f"{CARDS_PATH} answered without a card_id")
        opened_ms = int(time.time() * 1000)
        content = json.dumps({"type": "card", "data": {"card_id": card_id}})
        sent = await self.outbound.post_message(message, "interactive", content)
        if not sent:
            raise ChannelRejected("Feishu answered the card message without a message_id")
        self._sequences[card_id] = 0
        return CardPreview(card_id, opened_ms, sent).preview_id

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        card = CardPreview.parse(preview_id)
        if card is None:
            await self.text_previews.edit(message, preview_id)
            return
        if card.age() >= self.streaming_seconds:
            return  # streaming mode is about to close; the answer replaces the card
        await self._put_content(card, message.text, None)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        card = CardPreview.parse(preview_id)
        if card is None:
            return await self.text_previews.finish(message, preview_id)
        chunks = split_text(outbound_text(message.parts), CARD_TEXT_BYTES, units=_utf8_bytes)
        media = held_media(message)

        async def deliver(index: int, chunk: str) -> str | None:
            if index > 0 or not chunks:
                return await self.outbound.deliver_step(message, index, chunks, media)
            try:
                await self._complete(card, chunk, message.message_id)
            except ChannelRejected as exc:
                # The card is gone (deleted, or not ours): the message goes, the answer comes anew.
                log.info("feishu_card_replaced", card_id=card.card_id, reason=exc.detail)
                try:
                    await self.outbound.delete(card.message_id)
                except DeliveryError as gone:
                    log.warning("feishu_card_recall_failed", error=gone.detail)
                return await self.outbound.deliver_step(message, index, chunks, media)
            return card.message_id

        return await self.outbound.reply(
            message.message_id, chunks, len(media), deliver, shown=card.message_id
        )

    async def _complete(self, card: CardPreview, text: str, answer_id: str) -> None:
        """The answer as the card's text, streaming mode closed."""
        if card.age() < self.streaming_seconds:
            try:
                await self._put_content(card, text, f"{answer_id}-content")
            except ChannelRejected as exc:  # streaming already closed (expired, or by our last try)
                log.info("feishu_card_streaming_closed", card_id=card.card_id, reason=exc.detail)
            else:
                settings = {"config": {"streaming_mode": False}}
                await self.outbound.api.patch(
                    f"{CARDS_PATH}/{card.card_id}/settings",
                    {
                        "settings": json.dumps(settings),
                        "uuid": f"{answer_id}-settings",
                        "sequence": self._next_sequence(card),
                    },
                )
                return
        await self.outbound.api.put(
            f"{CARDS_PATH}/{card.card_id}",
            {
                "card": {
                    "type": "card_json",
                    "data": json.dumps(card_json(text, streaming=False), ensure_ascii=False),
                },
                "uuid": f"{answer_id}-card",
                "sequence": self._next_sequence(card),
            },
        )

    async def _put_content(self, card: CardPreview, text: str, idempotency_key: str | None) -> None:
        body: dict[str, Any] = {
            "content": text,
            "sequence": self._next_sequence(card),
            "uuid": idempotency_key or str(uuid.uuid4()),
        }
        await self.outbound.api.put(f"{CARDS_PATH}/{card.card_id}/elements/{ELEMENT_ID}/content", body)

    def _next_sequence(self, card: CardPreview) -> int:
        """Greater than every sequence used on this card, by this process or an earlier one."""
        since_open = int(time.time() * 1000) - card.opened_ms
        sequence = max(self._sequences.get(card.card_id, 0) + 1, since_open)
        self._sequences[card.card_id] = sequence
        self._sequences.move_to_end(card.card_id)
        while len(self._sequences) > _REMEMBERED:
            self._sequences.popitem(last=False)
        return sequence


def _utf8_bytes(text: str) -> int:
    return len(text.encode())
