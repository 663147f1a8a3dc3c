"""Streamed replies on DingTalk as an AI card (`DINGTALK_STREAMING=native`).

The same calls as the official SDK's `AICardReplier` (dingtalk-stream), made through the
channel's own client: `POST /v1.0/card/instances/createAndDeliver` puts a card built from
`DINGTALK_CARD_TEMPLATE_ID` into the chat (`openSpaceId` `dtv1.card//IM_GROUP.<cid>` or
`dtv1.card//IM_ROBOT.<staff id>`), and `PUT /v1.0/card/streaming` replaces the card's
streaming variable (`DINGTALK_CARD_CONTENT_KEY`) with the current view (`isFull`); the
final answer is the last such update with `isFinalize`, then the card's `flowStatus` is
set to finished (`PUT /v1.0/card/instances`). The template must be an AI card template
whose content variable is a streaming variable; it is made in the developer console.

A sender outside the organisation (no staff id) cannot get a card: no preview, the
answer is a plain message. An answer longer than `DINGTALK_MAX_MESSAGE_CHARS` continues
in plain messages after the card, and its images and files follow as robot messages.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import TYPE_CHECKING, Any

import structlog

from app.channel import SendResult
from app.errors import ChannelRejected, DeliveryError
from app.events import OutboundMessage
from channels.common.steps import held_media

if TYPE_CHECKING:
    from channels.dingtalk.outbound import DingTalkOutbound
    from channels.dingtalk.settings import DingTalkSettings

log = structlog.get_logger(__name__)

CREATE_PATH = "/v1.0/card/instances/createAndDeliver"
STREAMING_PATH = "/v1.0/card/streaming"
INSTANCES_PATH = "/v1.0/card/instances"
FLOW_PROCESSING, FLOW_FINISHED = "1", "3"  # the SDK's AICardStatus


class DingTalkCardStreamer:
    def __init__(self, outbound: DingTalkOutbound, settings: DingTalkSettings) -> None:
        assert settings.card_template_id
        self.outbound = outbound
        self.api = outbound.api
        self.template = settings.card_template_id
        self.key = settings.card_content_key
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        return None

    def edits_card(self, preview_id: str) -> bool:
        """Every edit is a card update (`app.streaming.protocol.CardEdits`): paced by the
        `dingtalk.card` bucket (OpenAPI calls), not as robot messages to the chat."""
        return True

    async def open(self, message: OutboundMessage) -> str:
        meta = message.metadata
        if meta.get("reply_webhook_only"):
            raise ChannelRejected("no staff id: DingTalk cannot deliver a card to this sender")
        track_id = hashlib.sha256(f"{message.channel}:{message.chat_id}:{uuid.uuid4()}".encode()).hexdigest()
        params = {self.key: message.text, "flowStatus": FLOW_PROCESSING}
        await create_card(self.outbound, message, template=self.template, track_id=track_id, params=params)
        return track_id

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self._stream(preview_id, message.text, final=False)

    async def _stream(self, track_id: str, text: str, *, final: bool) -> None:
        body = {
            "outTrackId": track_id,
            "guid": str(uuid.uuid4()),
            "key": self.key,
            "content": text,
            "isFull": True,
            "isFinalize": final,
            "isError": False,
        }
        await self.api.call("PUT", STREAMING_PATH, body)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = self.outbound.chunks(message)
        media = held_media(message)

        async def deliver(index: int, chunk: str) -> str | None:
            if index > 0 or not chunks:
                return await self.outbound.deliver_step(message, index, chunks, media)
            try:
                await self._stream(preview_id, chunk, final=True)
            except ChannelRejected:
                # The card is gone (or was never created): the answer as a plain message.
                return await self.outbound.post(message, chunk)
            # The card's state to "finished" (as the SDK's `finish`): best-effort, the answer
            # is already final in the card and must not be sent again by a retry.
            data = {"cardParamMap": {self.key: chunk, "flowStatus": FLOW_FINISHED}}
            try:
                await self.api.call("PUT", INSTANCES_PATH, {"outTrackId": preview_id, "cardData": data})
            except DeliveryError as exc:
                log.warning("dingtalk_card_finish_status_failed", error=exc.detail)
            return preview_id

        return await self.outbound.reply(message.message_id, chunks, len(media), deliver, shown=preview_id)


async def create_card(
    outbound: DingTalkOutbound,
    message: OutboundMessage,
    *,
    template: str,
    track_id: str,
    params: dict[str, str],
) -> None:
    """`createAndDeliver` a card of `template` into the message's chat, its callbacks (button
    presses) over the Stream connection; `ChannelRejected` when DingTalk did not deliver it."""
    body: dict[str, Any] = {
        "cardTemplateId": template,
        "outTrackId": track_id,
        "cardData": {"cardParamMap": params},
        "callbackType": "STREAM",
        "imGroupOpenSpaceModel": {"supportForward": True},
        "imRobotOpenSpaceModel": {"supportForward": True},
    }
    if _is_group(message):
        body["openSpaceId"] = f"dtv1.card//IM_GROUP.{message.chat_id}"
        body["imGroupOpenDeliverModel"] = {"robotCode": outbound.robot_code(message.metadata)}
    else:
        body["openSpaceId"] = f"dtv1.card//IM_ROBOT.{message.chat_id}"
        body["imRobotOpenDeliverModel"] = {"spaceType": "IM_ROBOT"}
    data = await outbound.api.call("POST", CREATE_PATH, body)
    result = data.get("result")
    delivered = result.get("deliverResults") if isinstance(result, dict) else None
    if (
        isinstance(delivered, list)
        and delivered
        and not all(isinstance(d, dict) and d.get("success") for d in delivered)
    ):
        raise ChannelRejected(f"DingTalk did not deliver the card: {json.dumps(delivered)[:200]}")


def _is_group(message: OutboundMessage) -> bool:
    kind = message.metadata.get("reply_conversation_type")
    return kind == "2" if kind in ("1", "2") else message.chat_id.startswith("cid")
