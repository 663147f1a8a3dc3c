"""LINE webhook events → `InboundEvent`s.

Chat ids are LINE's own ids, which already say what they are (`U…` a user, `C…` a group,
`R…` a multi-person room): a push message goes to them as they are. A user source is a
direct chat; groups and rooms are group chats. The inbox's external id is the event's
`webhookEventId`, the same on every redelivery (`deliveryContext.isRedelivery`), so a
redelivered event is stored once.
"""

from __future__ import annotations

import time
from typing import Any

from app.errors import InvalidPayload
from app.events import (
    MESSAGE_REF_KEY,
    ChatType,
    FilePart,
    ImagePart,
    InboundEvent,
    MentionPart,
    Part,
    ReplyToPart,
    TextPart,
)
from channels.line.native import NATIVE_TYPES, native_events
from channels.line.settings import LineSettings

# Message types whose bytes come from the content API by message id (when LINE holds them).
_MEDIA_MIME = {"image": "image/jpeg", "video": "video/mp4", "audio": "audio/m4a"}


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def content_url(data_api_base_url: str, message_id: str) -> str:
    return f"{data_api_base_url.rstrip('/')}/v2/bot/message/{message_id}/content"


def quoted_in_group(raw: Any) -> tuple[str, str] | None:
    """(group or room id, quoted message id) of a group message that quotes another one."""
    if not isinstance(raw, dict) or not isinstance(raw.get("message"), dict):
        return None
    source = raw.get("source")
    if not isinstance(source, dict):
        return None
    chat = _str(source.get("groupId")) or _str(source.get("roomId"))
    quoted = _str(raw["message"].get("quotedMessageId"))
    return (chat, quoted) if chat and quoted else None


def parse_event(
    raw: Any, settings: LineSettings, bot_messages: frozenset[str] = frozenset()
) -> InboundEvent | None:
    """One webhook message event; None for events that are not messages to answer (follow,
    standby mode, a group message not for the bot with `LINE_REQUIRE_MENTION_IN_GROUPS`:
    neither @-mentioning it nor quoting one of `bot_messages`, ids of the bot's messages)."""
    if not isinstance(raw, dict):
        raise InvalidPayload("each event must be a JSON object")
    if raw.get("type") != "message" or raw.get("mode", "active") != "active":
        return None  # standby: another channel of a module answers this chat
    message = raw.get("message")
    if not isinstance(message, dict):
        raise InvalidPayload("a message event needs message and source objects")
    kind, chat_id, chat_type, user = _source(raw)
    # In groups LINE leaves userId out for members who never agreed to share it.
    sender = user or f"anonymous:{chat_id}"
    message_id = _str(message.get("id"))
    parts = _parts(message, message_id, settings.data_api_base_url)
    quoted = _str(message.get("quotedMessageId"))
    if quoted:
        parts.insert(0, ReplyToPart(message_id=quoted))
    if chat_type is ChatType.GROUP and settings.require_mention_in_groups:
        mentioned = any(isinstance(p, MentionPart) and p.is_self for p in parts)
        if not mentioned and quoted not in bot_messages:
            return None  # LINE sends a bot every group message; this one is not for it
    event_id = _str(raw.get("webhookEventId"))
    external = f"event:{event_id}" if event_id else (f"msg:{message_id}" if message_id else None)
    metadata = _reply_metadata(raw, kind)
    if message_id:
        metadata[MESSAGE_REF_KEY] = message_id  # an unsend of it finds its event
    quote = _str(message.get("quoteToken"))
    if quote:
        metadata["reply_quote_token"] = quote
    return InboundEvent(
        channel="line",
        chat_id=chat_id,
        sender_id=sender,
        chat_type=chat_type,
        parts=tuple(parts),
        external_id=external,
        session_scope=settings.session_scope,
        metadata=metadata,
    )


def parse_events(
    raw: Any, settings: LineSettings, bot_messages: frozenset[str] = frozenset()
) -> list[InboundEvent]:
    """The events of one webhook event: a message (`parse_event`), or the native events of
    an `unsend`, `postback`, `memberJoined` or `memberLeft` (`channels.line.native`)."""
    if not isinstance(raw, dict) or raw.get("type") not in NATIVE_TYPES:
        event = parse_event(raw, settings, bot_messages)
        return [event] if event is not None else []
    if raw.get("mode", "active") != "active":
        return []
    kind, chat_id, chat_type, user = _source(raw)
    return native_events(
        raw,
        chat_id=chat_id,
        chat_type=chat_type,
        user=user,
        metadata=_reply_metadata(raw, kind),
        scope=settings.session_scope,
    )


def _source(raw: dict[str, Any]) -> tuple[str, str, ChatType, str]:
    """(source type, chat id, chat type, user id or "") of an event's `source`."""
    source = raw.get("source")
    if not isinstance(source, dict):
        raise InvalidPayload(f"a {raw.get('type')} event needs a source object")
    kind = _str(source.get("type"))
    user = _str(source.get("userId"))
    if kind == "user":
        chat_id, chat_type = user, ChatType.DIRECT
    elif kind == "group":
        chat_id, chat_type = _str(source.get("groupId")), ChatType.GROUP
    elif kind == "room":
        chat_id, chat_type = _str(source.get("roomId")), ChatType.GROUP
    else:
        raise InvalidPayload(f"unknown source type {kind!r}")
    if not chat_id:
        raise InvalidPayload(f"a {kind} source without its id")
    return kind, chat_id, chat_type, user


def _reply_metadata(raw: dict[str, Any], kind: str) -> dict[str, Any]:
    metadata: dict[str, Any] = {"reply_source": kind}
    token = _str(raw.get("replyToken"))
    if token:
        metadata["reply_token"] = token
        metadata["reply_token_at"] = _sent_at(raw.get("timestamp"))
    delivery = raw.get("deliveryContext")
    if isinstance(delivery, dict) and delivery.get("isRedelivery") is True:
        metadata["line_redelivery"] = True
    return metadata


def _sent_at(timestamp: Any) -> float:
    """When LINE sent the event (seconds), never later than now: the reply token's age."""
    now = time.time()
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool) and timestamp > 0:
        return min(now, timestamp / 1000)
    return now


def _parts(message: dict[str, Any], message_id: str, data_api_base_url: str) -> list[Part]:
    kind = _str(message.get("type"))
    parts: list[Part] = []
    if kind == "text":
        mention = message.get("mention")
        for m in (mention.get("mentionees") if isinstance(mention, dict) else None) or []:
            if isinstance(m, dict):
                parts.append(MentionPart(user_id=_str(m.get("userId")), is_self=m.get("isSelf") is True))
        parts.append(TextPart(text=_str(message.get("text"))))
        return parts
    provider = message.get("contentProvider")
    on_line = not isinstance(provider, dict) or provider.get("type", "line") == "line"
    url = content_url(data_api_base_url, message_id) if message_id and on_line else None
    if kind == "image":
        parts.append(ImagePart(url=url, mime_type=None))
    elif kind in ("video", "audio"):
        parts.append(FilePart(url=url, name=f"{kind}-{message_id}", mime_type=_MEDIA_MIME[kind]))
    elif kind == "file":
        size = message.get("fileSize")
        parts.append(
            FilePart(
                url=url,
                name=_str(message.get("fileName")) or f"file-{message_id}",
                size=size if isinstance(size, int) else None,
            )
        )
    elif kind == "location":
        where = ", ".join(x for x in (_str(message.get("title")), _str(message.get("address"))) if x)
        parts.append(
            TextPart(text=f"[location] {where} ({message.get('latitude')}, {message.get('longitude')})")
        )
    elif kind == "sticker":
        words = message.get("keywords")
        said = ", ".join(w for w in words if isinstance(w, str)) if isinstance(words, list) else ""
        parts.append(TextPart(text=f"[sticker] {said}".strip()))
    else:
        parts.append(TextPart(text=f"[{kind or 'unknown'} message]"))
    return parts
