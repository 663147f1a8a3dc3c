"""DingTalk robot messages → `InboundEvent`s: single and group chats, text and rich text.

The same JSON arrives over Stream mode (the `data` of a CALLBACK frame with topic
`/v1.0/im/bot/messages/get`) and over the HTTP callback (the request body).

Which chat a reply goes to must be readable from the event alone (a cron job or an
operator may send long after the message came), so:

- a group chat's `chat_id` is its `conversationId` (the `openConversationId` the group
  send API takes; DingTalk's all start with `cid`);
- a single chat's `chat_id` is the sender's `senderStaffId` (the `userIds` the one-to-one
  send API takes), or `senderId` for people outside the organisation, who can only be
  answered through the `sessionWebhook`.
"""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidPayload
from app.events import ROLE_KEY, ChatType, FilePart, ImagePart, InboundEvent, MentionPart, Part, TextPart
from channels.dingtalk.settings import DingTalkSettings

CHANNEL = "dingtalk"
# A picture or file as DingTalk gives it: a download code for the robot's
# `messageFiles/download` API (`channels.dingtalk.openapi.DingTalkApi.download_url`).
DOWNLOAD_PREFIX = "dingtalk-download:"
SINGLE = "1"
GROUP = "2"


@dataclass(frozen=True)
class Parsed:
    event: InboundEvent | None = None
    ignored: str | None = None


def parse_message(payload: Any, settings: DingTalkSettings) -> Parsed:
    """One robot message; `InvalidPayload` (400) when it is not one."""
    if not isinstance(payload, dict):
        raise InvalidPayload("a robot message must be a JSON object")
    msg_id = payload.get("msgId")
    conversation_id = payload.get("conversationId")
    conversation_type = str(payload.get("conversationType") or "")
    if not isinstance(msg_id, str) or not msg_id:
        raise InvalidPayload("msgId is missing")
    if not isinstance(conversation_id, str) or not conversation_id:
        raise InvalidPayload("conversationId is missing")
    if conversation_type not in (SINGLE, GROUP):
        raise InvalidPayload("conversationType must be 1 (single) or 2 (group)")
    staff_id = payload.get("senderStaffId")
    sender_id = staff_id if isinstance(staff_id, str) and staff_id else payload.get("senderId")
    if not isinstance(sender_id, str) or not sender_id:
        raise InvalidPayload("senderStaffId or senderId is missing")

    group = conversation_type == GROUP
    mentioned = payload.get("isInAtList") is True
    if group and settings.require_mention_in_groups and not mentioned:
        return Parsed(ignored="group message without a mention of the robot")

    kind = payload.get("msgtype")
    text = _text_of(kind, payload)
    media = _media_of(kind, payload)
    if text is None and not media:
        return Parsed(ignored=f"message type {kind} is not supported")
    if not text and not media:
        return Parsed(ignored="no text")
    parts: list[Part] = [TextPart(text=text)] if text else []
    parts += media
    bot_user_id = payload.get("chatbotUserId")
    if group and mentioned and isinstance(bot_user_id, str) and bot_user_id:
        parts.append(MentionPart(user_id=bot_user_id, is_self=True))

    metadata: dict[str, Any] = {
        "dingtalk_msg_id": msg_id,
        "dingtalk_conversation_id": conversation_id,
        "reply_conversation_type": conversation_type,
    }
    if not group and sender_id != staff_id:
        metadata["reply_webhook_only"] = True  # no staff id: the robot API cannot reach them
    for key, name in (("senderNick", "sender_name"), ("conversationTitle", "chat_title")):
        if isinstance(payload.get(key), str):
            metadata[name] = payload[key]
    if group and payload.get("isAdmin") is True:  # the sender administers the organization
        metadata[ROLE_KEY] = "admin"  # (app.access.roles); others are members
    if isinstance(payload.get("robotCode"), str) and payload["robotCode"] != "normal":
        metadata["reply_robot_code"] = payload["robotCode"]
    webhook = payload.get("sessionWebhook")
    expires = payload.get("sessionWebhookExpiredTime")
    # Without an expiry we cannot tell whether the webhook is still valid: it is not used.
    if isinstance(webhook, str) and webhook.startswith(("http://", "https://")):
        if isinstance(expires, int) or (isinstance(expires, str) and expires.isdigit()):
            metadata["reply_session_webhook_expires_ms"] = int(expires)
            metadata["reply_session_webhook"] = webhook
    return Parsed(
        event=InboundEvent(
            channel=CHANNEL,
            chat_id=conversation_id if group else sender_id,
            sender_id=sender_id,
            chat_type=ChatType.GROUP if group else ChatType.DIRECT,
            parts=tuple(parts),
            external_id=msg_id,
            session_scope=settings.session_scope,
            metadata=metadata,
        )
    )


def _media_of(kind: Any, payload: dict[str, Any]) -> list[Part]:
    """Pictures (also inside rich text) and files as download-code references; audio as its file."""
    content = payload.get("content")
    content = content if isinstance(content, dict) else {}

    def ref(item: dict[str, Any]) -> str | None:
        code = item.get("downloadCode")
        return DOWNLOAD_PREFIX + code if isinstance(code, str) and code else None

    parts: list[Part] = []
    if kind == "picture" and (url := ref(content)):
        parts.append(ImagePart(url=url))
    elif kind == "richText":
        items = content.get("richText")
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") == "picture" and (url := ref(item)):
                parts.append(ImagePart(url=url))
    elif kind in ("file", "audio", "video") and (url := ref(content)):
        parts.append(FilePart(url=url, name=_file_name(kind, content), mime_type=_file_mime(kind, content)))
    return parts


def _video_type(content: dict[str, Any]) -> str:
    video_type = content.get("videoType")
    return video_type if isinstance(video_type, str) and video_type.isalnum() else "mp4"


def _file_name(kind: str, content: dict[str, Any]) -> str | None:
    """`file` has `fileName`; voice (AMR) and video (`videoType`) come without a name."""
    name = content.get("fileName")
    if isinstance(name, str) and name:
        return name
    if kind == "audio":
        return "voice.amr"
    return f"video.{_video_type(content)}" if kind == "video" else None


def _file_mime(kind: str, content: dict[str, Any]) -> str | None:
    if kind == "audio":
        return "audio/amr"
    if kind == "video":
        return f"video/{_video_type(content)}"
    name = _file_name(kind, content)
    return mimetypes.guess_type(name)[0] if name else None


def _text_of(kind: Any, payload: dict[str, Any]) -> str | None:
    """The message's text (stripped), or None when the message type carries none we read."""
    if kind == "text":
        text = payload.get("text")
        content = text.get("content") if isinstance(text, dict) else None
        if not isinstance(content, str):
            raise InvalidPayload("text message without text.content")
        return content.strip()
    if kind == "richText":
        content = payload.get("content")
        items = content.get("richText") if isinstance(content, dict) else None
        if not isinstance(items, list):
            raise InvalidPayload("richText message without content.richText")
        # Pictures in rich text carry download codes only; their text pieces are the message.
        pieces = [i["text"] for i in items if isinstance(i, dict) and isinstance(i.get("text"), str)]
        return "".join(pieces).strip()
    if kind == "audio":  # DingTalk's own transcript of a voice message
        content = payload.get("content")
        recognition = content.get("recognition") if isinstance(content, dict) else None
        return recognition.strip() if isinstance(recognition, str) else ""
    return None
