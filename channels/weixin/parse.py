"""iLink `WeixinMessage`s (getupdates `msgs`) → `InboundEvent`s.

A message from a person (`message_type` 1) becomes an event; the bot's own messages
(type 2) are ignored. `message_id` (or the first item's `msg_id`) is the dedup key.
A message with a `group_id` is a group chat keyed by the group; others are direct chats
keyed by the sender (`from_user_id`, `…@im.wechat`). The message's `context_token`
travels in the event's reply metadata: the reply must carry the conversation's token.

Media items carry CDN references (`encrypt_query_param`, an AES key) rather than URLs;
they become image/file parts whose `url` is `weixin-media:<n>`, and the references stay
beside the event (`Parsed.media`) for the download, never stored in the inbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.events import ChatType, FilePart, ImagePart, InboundEvent, Part, ReplyToPart, TextPart
from channels.weixin.api import (
    ITEM_FILE,
    ITEM_IMAGE,
    ITEM_TEXT,
    ITEM_VIDEO,
    ITEM_VOICE,
    MESSAGE_TYPE_BOT,
)
from channels.weixin.settings import WeixinSettings

CHANNEL = "weixin"
MEDIA_PREFIX = "weixin-media:"


@dataclass(frozen=True)
class MediaRef:
    """Where one media item lies on the CDN and how it is encrypted."""

    kind: int  # ITEM_IMAGE, ITEM_VOICE, ITEM_FILE, ITEM_VIDEO
    encrypt_query_param: str | None
    aes_key: str | None  # CDNMedia.aes_key (base64 of 16 bytes, or of 32 hex characters)
    aes_key_hex: str | None = None  # image_item.aeskey: preferred for images
    full_url: str | None = None


@dataclass(frozen=True)
class Parsed:
    event: InboundEvent | None = None
    ignored: str | None = None
    media: dict[str, MediaRef] = field(default_factory=dict)  # part url → reference
    context_token: str | None = None
    sent_at_ms: int = 0  # create_time_ms: which of two tokens of a peer is the newer


def message_id(msg: dict[str, Any]) -> str | None:
    top = str(msg.get("message_id") or "").strip()
    if top:
        return top
    for item in msg.get("item_list") or []:
        if isinstance(item, dict) and str(item.get("msg_id") or "").strip():
            return str(item["msg_id"]).strip()
    return None


def parse_message(msg: Any, settings: WeixinSettings) -> Parsed:
    if not isinstance(msg, dict):
        return Parsed(ignored="not an object")
    if msg.get("message_type") == MESSAGE_TYPE_BOT:
        return Parsed(ignored="the bot's own message")
    sender = str(msg.get("from_user_id") or "")
    if not sender:
        return Parsed(ignored="no from_user_id")
    group = str(msg.get("group_id") or "")
    parts, media = _parts(msg.get("item_list"))
    if not parts:
        return Parsed(ignored="no text or media")
    mid = message_id(msg)
    seq = msg.get("seq")
    external = f"msg:{mid}" if mid else (f"seq:{seq}" if isinstance(seq, int) else None)
    context_token = str(msg.get("context_token") or "") or None
    chat_id = group or sender
    metadata: dict[str, Any] = {"reply_to_user": sender}
    if context_token:
        metadata["reply_context_token"] = context_token
    if mid:
        metadata["weixin_message_id"] = mid
    event = InboundEvent(
        channel=CHANNEL,
        chat_id=chat_id,
        sender_id=sender,
        chat_type=ChatType.GROUP if group else ChatType.DIRECT,
        parts=tuple(parts),
        external_id=external,
        session_scope=settings.session_scope,
        metadata=metadata,
    )
    sent = msg.get("create_time_ms")
    sent_at = sent if isinstance(sent, int) else 0
    return Parsed(event=event, media=media, context_token=context_token, sent_at_ms=sent_at)


def _parts(items: Any) -> tuple[list[Part], dict[str, MediaRef]]:
    parts: list[Part] = []
    media: dict[str, MediaRef] = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        ref = item.get("ref_msg")
        if isinstance(ref, dict) and str(ref.get("svr_id") or "").strip():
            parts.append(ReplyToPart(message_id=str(ref["svr_id"])))
        if kind == ITEM_TEXT:
            text = str((item.get("text_item") or {}).get("text") or "")
            if text:
                parts.append(TextPart(text=text))
            continue
        if kind == ITEM_VOICE and str((item.get("voice_item") or {}).get("text") or ""):
            # WeChat's own transcript of the voice note is what Tencent's client hands on.
            parts.append(TextPart(text=str(item["voice_item"]["text"])))
            continue
        body_key = {
            ITEM_IMAGE: "image_item",
            ITEM_VOICE: "voice_item",
            ITEM_FILE: "file_item",
            ITEM_VIDEO: "video_item",
        }
        if kind not in body_key:
            continue
        body = item.get(body_key[kind]) or {}
        cdn = body.get("media") if isinstance(body, dict) else None
        if not isinstance(cdn, dict):
            continue
        url = f"{MEDIA_PREFIX}{len(media)}"
        media[url] = MediaRef(
            kind=kind,
            encrypt_query_param=_str(cdn.get("encrypt_query_param")),
            aes_key=_str(cdn.get("aes_key")),
            aes_key_hex=_str(body.get("aeskey")) if kind == ITEM_IMAGE else None,
            full_url=_str(cdn.get("full_url")),
        )
        if kind == ITEM_IMAGE:
            parts.append(ImagePart(url=url))
        elif kind == ITEM_VOICE:
            parts.append(FilePart(url=url, name="voice.silk", mime_type="audio/silk"))
        elif kind == ITEM_VIDEO:
            parts.append(FilePart(url=url, name="video.mp4", mime_type="video/mp4"))
        else:
            size = str(body.get("len") or "")
            parts.append(
                FilePart(
                    url=url,
                    name=_str(body.get("file_name")) or "file",
                    size=int(size) if size.isdigit() else None,
                )
            )
    return parts, media


def _str(value: Any) -> str | None:
    return str(value) if isinstance(value, str) and value else None
