"""Feishu's outbound seam: the calls that send, edit and recall messages, for replies and previews.

`FeishuOutbound` is what the adapter's `send` and both streamers (`stream.py`,
`card.py`) use: one `FeishuApi` (tenant token, error mapping; `api` for the card calls)
and the reply's steps (`channels.common.steps`), so a retried reply never sends a chunk
twice, whoever sent it first.
"""

from __future__ import annotations

import json
from typing import Any

from app.events import FilePart, ImagePart, OutboundMessage
from channels.common.chunks import split_text
from channels.common.steps import StepSender
from channels.common.wechat_api import outbound_text
from channels.feishu.api import FeishuApi
from channels.feishu.media import upload
from channels.feishu.settings import FeishuSettings

MESSAGES = "/open-apis/im/v1/messages"


class FeishuOutbound(StepSender):
    def __init__(self, api: FeishuApi, settings: FeishuSettings) -> None:
        super().__init__()
        self.api = api
        self.settings = settings

    async def edit_text(self, message_id: str, text: str) -> None:
        """Replace a text message's text (Feishu allows a message 20 edits)."""
        await self.api.put(f"{MESSAGES}/{message_id}", {"msg_type": "text", "content": text_content(text)})

    async def delete(self, message_id: str) -> None:
        """Recall a message the bot sent."""
        await self.api.delete(f"{MESSAGES}/{message_id}")

    def chunks(self, message: OutboundMessage) -> list[str]:
        return split_text(outbound_text(message.parts), self.settings.max_message_bytes, units=_sent_bytes)

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str | None:
        """One step of a reply: text chunk `index`, or (after the text) one upload and its message."""
        if index < len(chunks):
            msg_type, content = "text", json.dumps({"text": chunks[index]}, ensure_ascii=False)
        else:
            msg_type, content = await upload(self.api, media[index - len(chunks)])
        # Feishu sends at most one message per uuid within an hour.
        return await self.post_message(message, msg_type, content, uuid=f"{message.message_id}-{index}")

    async def post_message(
        self, message: OutboundMessage, msg_type: str, content: str, *, uuid: str | None = None
    ) -> str | None:
        """Send one message where the reply goes (a reply to the message, or into the chat)."""
        reply_to, in_thread = _reply_target(message)
        body: dict[str, Any] = {"msg_type": msg_type, "content": content}
        if uuid is not None:
            body["uuid"] = uuid
        if reply_to:
            body["reply_in_thread"] = in_thread
            data = await self.api.post(f"/open-apis/im/v1/messages/{reply_to}/reply", body)
        else:
            body["receive_id"] = message.chat_id
            data = await self.api.post("/open-apis/im/v1/messages", body, {"receive_id_type": "chat_id"})
        sent = data.get("message_id") if isinstance(data, dict) else None
        return str(sent) if sent else None


def text_content(text: str) -> str:
    return json.dumps({"text": text}, ensure_ascii=False)


def _reply_target(message: OutboundMessage) -> tuple[str | None, bool]:
    """The message to answer with /reply (and whether in its thread), or None to post in the chat."""
    replied = message.metadata.get("reply_feishu_message_id")
    if isinstance(replied, str) and replied:
        return replied, bool(message.metadata.get("reply_feishu_in_thread"))
    # A reply without its event (a scheduled job) for a thread session: the thread's root.
    if message.thread_id and message.thread_id.startswith("om_"):
        return message.thread_id, True
    return None, False


def _sent_bytes(char: str) -> int:
    """What one character weighs in the request: UTF-8, JSON-escaped twice (content is a JSON string)."""
    once = json.dumps(char, ensure_ascii=False)[1:-1]
    return len(json.dumps(once, ensure_ascii=False)[1:-1].encode())
