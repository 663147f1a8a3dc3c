"""`im.message.receive_v1` events → `InboundEvent`s: text, rich text, images, files; mentions; threads.

The event (schema 2.0) looks like
`{"schema": "2.0", "header": {"event_id", "event_type", "token", …}, "event": {"sender":
{"sender_id": {"open_id", …}, "sender_type"}, "message": {"message_id", "root_id",
"parent_id", "thread_id", "chat_id", "chat_type", "message_type", "content", "mentions"}}}`,
where `content` is itself a JSON string whose shape depends on `message_type`.
"""

from __future__ import annotations

import json
import mimetypes
import re
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidPayload
from app.events import (
    MESSAGE_REF_KEY,
    ChatType,
    FilePart,
    ImagePart,
    InboundEvent,
    MentionPart,
    NativeEvent,
    NativeKind,
    Part,
    ReplyToPart,
    TextPart,
)
from channels.feishu.settings import FeishuSettings

CHANNEL = "feishu"
MESSAGE_RECEIVED = "im.message.receive_v1"
MESSAGE_RECALLED = "im.message.recalled_v1"
RECALL_SENDER = "feishu:recall"  # the sender of a recall event: Feishu does not name one


@dataclass(frozen=True)
class Parsed:
    event: InboundEvent | None = None
    ignored: str | None = None
    # Ignored only for want of a mention, yet a reply to this message: addressed to the bot
    # if the bot wrote it (the payload does not say who did).
    unmentioned_reply_to: str | None = None


@dataclass(frozen=True)
class _Mention:
    key: str  # the placeholder in the text, "@_user_1"
    open_id: str | None
    name: str


def parse_message_event(
    payload: dict[str, Any],
    settings: FeishuSettings,
    bot_open_id: str | None,
    *,
    replied_to_bot: bool = False,
) -> Parsed:
    """One verified schema 2.0 `im.message.receive_v1` payload → an event, or why it is ignored.

    `replied_to_bot`: the message replies to one the bot sent, which addresses the bot in a
    group as a mention does.
    """
    header = payload.get("header")
    body = payload.get("event")
    if not isinstance(header, dict) or not isinstance(body, dict):
        raise InvalidPayload("a schema 2.0 event needs a header and an event object")
    event_id = header.get("event_id")
    if not isinstance(event_id, str) or not event_id:
        raise InvalidPayload("header.event_id is missing")
    message = body.get("message")
    sender = body.get("sender")
    if not isinstance(message, dict) or not isinstance(sender, dict):
        raise InvalidPayload("im.message.receive_v1 needs event.message and event.sender")
    if sender.get("sender_type", "user") != "user":
        return Parsed(ignored=f"sender_type {sender.get('sender_type')}")
    ids = sender.get("sender_id")
    sender_id = _str(ids.get("open_id")) if isinstance(ids, dict) else None
    message_id = _str(message.get("message_id"))
    chat_id = _str(message.get("chat_id"))
    if not sender_id or not message_id or not chat_id:
        raise InvalidPayload("the message needs message_id, chat_id and sender_id.open_id")
    if bot_open_id is not None and sender_id == bot_open_id:
        return Parsed(ignored="our own message")

    chat_type = ChatType.DIRECT if message.get("chat_type") == "p2p" else ChatType.GROUP
    mentions = _mentions(message.get("mentions"))
    self_mentions = [m for m in mentions if _is_self(m, bot_open_id)]
    parent_id = _str(message.get("parent_id"))
    gated = chat_type is ChatType.GROUP and settings.require_mention_in_groups
    if gated and not self_mentions and not replied_to_bot:
        return Parsed(ignored="group message without a mention of the bot", unmentioned_reply_to=parent_id)

    kind = _str(message.get("message_type")) or ""
    content = _content(message.get("content"))
    parts = _parts(kind, content, message_id, settings.api_base.rstrip("/"), mentions, bot_open_id)
    if self_mentions:
        parts.append(MentionPart(user_id=self_mentions[0].open_id or "", is_self=True))
    if parent_id:
        parts.append(ReplyToPart(message_id=parent_id))
    if not any(isinstance(p, (TextPart, ImagePart, FilePart)) for p in parts):
        return Parsed(ignored=f"no text, image or file in a {kind or 'typeless'} message")

    # A reply chain or a topic thread is identified by its root message: the first message
    # of a thread carries no root_id, its replies all carry the same one.
    root_id = _str(message.get("root_id"))
    platform_thread = _str(message.get("thread_id"))
    opens_thread = chat_type is ChatType.GROUP and settings.reply_in_thread
    thread_id = root_id or (message_id if opens_thread else None)
    in_thread = bool(platform_thread) or opens_thread
    reply_to_message = in_thread or (chat_type is ChatType.GROUP and settings.reply_to_message)
    metadata: dict[str, Any] = {
        "feishu_event_id": event_id,
        "feishu_message_id": message_id,
        MESSAGE_REF_KEY: message_id,  # a recall of it finds its event (docs/events.md)
        "feishu_message_type": kind,
        "tenant_key": header.get("tenant_key"),
        # Named on an approval card's buttons (`channels.feishu.native`): the press says no type.
        "reply_feishu_chat_type": "p2p" if chat_type is ChatType.DIRECT else "group",
    }
    if platform_thread:
        metadata["feishu_thread_id"] = platform_thread
    if reply_to_message:
        # `reply_…` keys travel with the reply (app.pipeline.replies.reply_for).
        metadata["reply_feishu_message_id"] = message_id
        metadata["reply_feishu_in_thread"] = in_thread
    return Parsed(
        event=InboundEvent(
            channel=CHANNEL,
            chat_id=chat_id,
            sender_id=sender_id,
            thread_id=thread_id,
            chat_type=chat_type,
            parts=tuple(parts),
            # Feishu redelivers an event it got no timely 200 for, with the same event_id.
            external_id=event_id,
            session_scope=settings.session_scope,
            metadata=metadata,
        )
    )


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _content(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, str):
        raise InvalidPayload("message.content must be a JSON string")
    try:
        content = json.loads(raw)
    except ValueError as exc:
        raise InvalidPayload(f"message.content is not JSON: {exc}") from exc
    if not isinstance(content, dict):
        raise InvalidPayload("message.content must be a JSON object")
    return content


def _mentions(raw: Any) -> list[_Mention]:
    found: list[_Mention] = []
    if not isinstance(raw, list):
        return found
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("key"), str):
            continue
        ids = item.get("id")
        open_id = _str(ids.get("open_id")) if isinstance(ids, dict) else None
        found.append(_Mention(key=item["key"], open_id=open_id, name=str(item.get("name") or "")))
    return found


def _is_self(mention: _Mention, bot_open_id: str | None) -> bool:
    # Without the bot's open_id (no credentials to ask bot/v3/info) any mention counts: by
    # default Feishu only delivers the group messages that mention the bot anyway.
    return bot_open_id is None or mention.open_id == bot_open_id


_KIND_MIME = {"audio": "audio/opus", "media": "video/mp4"}


def _parts(
    kind: str,
    content: dict[str, Any],
    message_id: str,
    api_base: str,
    mentions: list[_Mention],
    bot_open_id: str | None,
) -> list[Part]:
    def resource(key: str, type_: str) -> str:
        # Downloading needs the tenant access token (im:resource scope).
        return f"{api_base}/open-apis/im/v1/messages/{message_id}/resources/{key}?type={type_}"

    parts: list[Part] = []
    if kind == "text":
        text = _replace_mentions(str(content.get("text") or ""), mentions, bot_open_id)
        if text:
            parts.append(TextPart(text=text))
    elif kind == "post":
        parts += _post_parts(content, resource, mentions, bot_open_id)
    elif kind == "image":
        key = _str(content.get("image_key"))
        if key:
            parts.append(ImagePart(url=resource(key, "image")))
    elif kind in ("file", "audio", "media"):
        key = _str(content.get("file_key"))
        if key:
            # Voice messages are Opus without a name; videos (`media`) are MP4.
            name = _str(content.get("file_name")) or ("voice.opus" if kind == "audio" else None)
            mime = _KIND_MIME.get(kind) or (mimetypes.guess_type(name)[0] if name else None)
            parts.append(FilePart(url=resource(key, "file"), name=name, mime_type=mime))
    return parts


def _post_parts(
    content: dict[str, Any],
    resource: Any,
    mentions: list[_Mention],
    bot_open_id: str | None,
) -> list[Part]:
    """Rich text: `{"title", "content": [[element, …] per paragraph]}`, possibly under a locale key."""
    if "content" not in content:
        # The message's languages as keys ({"zh_cn": {...}, "en_us": {...}}): take the first.
        content = next((v for v in content.values() if isinstance(v, dict)), {})
    lines: list[str] = []
    images: list[Part] = []
    title = _str(content.get("title"))
    if title:
        lines.append(title)
    paragraphs = content.get("content")
    for paragraph in paragraphs if isinstance(paragraphs, list) else []:
        pieces: list[str] = []
        for element in paragraph if isinstance(paragraph, list) else []:
            if not isinstance(element, dict):
                continue
            tag = element.get("tag")
            if tag in ("text", "md", "code_block"):
                pieces.append(str(element.get("text") or ""))
            elif tag == "a":
                text, href = str(element.get("text") or ""), str(element.get("href") or "")
                pieces.append(f"{text} ({href})" if text and href and text != href else text or href)
            elif tag == "at":
                pieces.append(_at_text(element, mentions, bot_open_id))
            elif tag == "img" and _str(element.get("image_key")):
                images.append(ImagePart(url=resource(element["image_key"], "image")))
            elif tag == "media" and _str(element.get("file_key")):
                images.append(FilePart(url=resource(element["file_key"], "file")))
            elif tag == "emotion":
                pieces.append(f":{element.get('emoji_type', '')}:")
        line = re.sub(r"[ \t]{2,}", " ", "".join(pieces)).strip()
        if line:
            lines.append(line)
    parts: list[Part] = []
    if lines:
        parts.append(TextPart(text="\n".join(lines)))
    return parts + images


def _at_text(element: dict[str, Any], mentions: list[_Mention], bot_open_id: str | None) -> str:
    user = str(element.get("user_id") or "")
    for mention in mentions:
        if user in (mention.key, mention.open_id):
            return "" if _is_self(mention, bot_open_id) else f"@{mention.name or user}"
    if user == "all":
        return "@all"
    name = element.get("user_name")
    return f"@{name}" if name else ""


def _replace_mentions(text: str, mentions: list[_Mention], bot_open_id: str | None) -> str:
    """Drop the placeholders that mention the bot, name the other people mentioned."""
    # Longest keys first: "@_user_1" must not eat the start of "@_user_10".
    for mention in sorted(mentions, key=lambda m: len(m.key), reverse=True):
        text = text.replace(mention.key, "" if _is_self(mention, bot_open_id) else f"@{mention.name}")
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def parse_recall(payload: dict[str, Any], settings: FeishuSettings) -> Parsed:
    """`im.message.recalled_v1` → a `recalled` event. Feishu names the message and its chat,
    not who wrote it (nor the chat's type): the event's sender is a stand-in and the
    author is not checked (`NativeEvent.author_known`), so with `user_in_chat` sessions a
    recall reaches the chat's key, not the member's (docs/events.md)."""
    header, body = payload.get("header"), payload.get("event")
    if not isinstance(header, dict) or not isinstance(body, dict):
        raise InvalidPayload("a schema 2.0 event needs a header and an event object")
    event_id, message_id, chat_id = (
        _str(header.get("event_id")),
        _str(body.get("message_id")),
        _str(body.get("chat_id")),
    )
    if not event_id or not message_id or not chat_id:
        raise InvalidPayload("im.message.recalled_v1 needs header.event_id, message_id and chat_id")
    return Parsed(
        event=InboundEvent.native(
            NativeEvent(kind=NativeKind.RECALLED, target=message_id, author_known=False),
            channel=CHANNEL,
            chat_id=chat_id,
            sender_id=RECALL_SENDER,
            chat_type=ChatType.GROUP,
            external_id=event_id,
            session_scope=settings.session_scope,
            metadata={"feishu_event_id": event_id, "recall_type": body.get("recall_type")},
        )
    )
