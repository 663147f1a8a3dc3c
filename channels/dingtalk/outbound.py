"""DingTalk's outbound seam: the robot API and session-webhook sends, for replies and card previews.

`DingTalkOutbound` is what the adapter's `send` and the card streamer (`card.py`) use:
one `DingTalkApi` (`api`, also for the card calls), the choice between the session
webhook and the robot API, and the reply's steps (`channels.common.steps`), so a retried
reply never sends a chunk twice, whoever sent it first.
"""

from __future__ import annotations

import time
from typing import Any

import structlog

from app.errors import ChannelRejected, DeliveryError
from app.events import FilePart, ImagePart, OutboundMessage
from channels.common.chunks import split_text
from channels.common.steps import StepSender
from channels.common.wechat_api import outbound_text
from channels.dingtalk.media import unsendable_text, upload
from channels.dingtalk.openapi import DingTalkApi
from channels.dingtalk.parse import GROUP, SINGLE
from channels.dingtalk.settings import DingTalkSettings

log = structlog.get_logger(__name__)

# A session webhook is not used in its last seconds: the send could arrive after it expired.
WEBHOOK_MARGIN_MS = 30_000


class DingTalkOutbound(StepSender):
    def __init__(self, api: DingTalkApi, settings: DingTalkSettings) -> None:
        super().__init__()
        self.api = api
        self.settings = settings

    def robot_code(self, metadata: dict[str, Any]) -> str:
        robot_code = str(metadata.get("reply_robot_code") or self.settings.robot_code or "")
        return robot_code or str(self.settings.client_id)

    def chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(outbound_text(message.parts), self.settings.max_message_chars)

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str | None:
        """One step of a reply: text chunk `index`, or (after the text) one upload and its message."""
        if index < len(chunks):
            return await self.post(message, chunks[index])
        part = media[index - len(chunks)]
        if message.metadata.get("reply_webhook_only"):
            # Only the session webhook reaches this sender, and it carries no media.
            return await self.post(message, unsendable_text(part, self.settings.locale))
        key, param = await upload(self.api, self.settings.oapi_base, part)
        return await self.api.send_robot(
            robot_code=self.robot_code(message.metadata),
            chat_id=message.chat_id,
            group=_is_group(message),
            msg_key=key,
            param=param,
        )

    async def post(self, message: OutboundMessage, text: str) -> str | None:
        webhook = self._valid_webhook(message.metadata)
        if webhook is not None:
            try:
                await self.api.send_by_webhook(webhook, text)
                return None
            except DeliveryError as exc:
                if message.metadata.get("reply_webhook_only"):
                    raise
                log.warning("dingtalk_session_webhook_failed", detail=exc.detail)
                # The robot API reaches the same chat; it decides whether to retry.
        elif message.metadata.get("reply_webhook_only"):
            raise ChannelRejected(
                "no valid session webhook (expired or disabled); the robot API cannot reach this sender"
            )
        return await self.api.send_text(
            robot_code=self.robot_code(message.metadata),
            chat_id=message.chat_id,
            group=_is_group(message),
            text=text,
        )

    def _valid_webhook(self, metadata: dict[str, Any]) -> str | None:
        if not self.settings.use_session_webhook:
            return None
        url = metadata.get("reply_session_webhook")
        expires = metadata.get("reply_session_webhook_expires_ms")
        if not isinstance(url, str) or not isinstance(expires, int):
            return None
        if time.time() * 1000 + WEBHOOK_MARGIN_MS >= expires:
            return None
        return url


def _is_group(message: OutboundMessage) -> bool:
    kind = message.metadata.get("reply_conversation_type")
    if kind in (GROUP, SINGLE):
        return bool(kind == GROUP)
    # No event to ask (a cron job, an operator's send): group conversation ids start with "cid".
    return message.chat_id.startswith("cid")
