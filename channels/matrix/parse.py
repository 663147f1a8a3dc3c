"""Matrix room events → `InboundEvent`s.

A room is a chat (`chat_id` is the room id); a Matrix thread (`m.relates_to` with
`rel_type: m.thread`) is the chat's thread, its id the thread root's event id, so with the
default `thread` scope each thread is its own session and the room's main timeline is
another. A room of two members (the bot and one person) is a direct chat; bigger rooms
are groups. The inbox's external id is the event id, the same every time a /sync gives
the event again (a take-over resuming from an older `next_batch`), so it is stored once.
"""

from __future__ import annotations

from typing import Any

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
from channels.matrix.settings import MatrixSettings

_FILE_TYPES = ("m.file", "m.audio", "m.video")


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def strip_reply_fallback(body: str) -> str:
    """The body without the quoted `> <@user> …` lines older clients put before a reply."""
    lines = body.split("\n")
    if not lines or not lines[0].startswith("> <"):
        return body
    while lines and lines[0].startswith(">"):
        lines.pop(0)
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def parse_message(
    event: dict[str, Any], room_id: str, bot_user: str, settings: MatrixSettings, *, direct: bool
) -> InboundEvent | None:
    """One timeline event; None for what is not a message to answer: the bot's own, edits
    (`m.replace`), notices (bots talk to each other with those: never answered), other
    event types, and group messages not for the bot with `MATRIX_REQUIRE_MENTION_IN_GROUPS`."""
    if event.get("type") != "m.room.message":
        return None
    sender, event_id = _str(event.get("sender")), _str(event.get("event_id"))
    if not sender or not event_id or sender == bot_user:
        return None
    content = _dict(event.get("content"))
    msgtype = _str(content.get("msgtype"))
    relates = _dict(content.get("m.relates_to"))
    if relates.get("rel_type") == "m.replace" or msgtype == "m.notice" or not msgtype:
        return None
    thread = _str(relates.get("event_id")) if relates.get("rel_type") == "m.thread" else ""
    reply = _str(_dict(relates.get("m.in_reply_to")).get("event_id"))
    if thread and relates.get("is_falling_back") is True:
        reply = ""  # the thread's fallback for clients without threads: not a real reply
    parts: list[Part] = []
    if reply:
        parts.append(ReplyToPart(message_id=reply))
    mentions = _dict(content.get("m.mentions")).get("user_ids")
    body = _str(content.get("body"))
    mentioned = (isinstance(mentions, list) and bot_user in mentions) or bot_user in body
    if mentioned:
        parts.append(MentionPart(user_id=bot_user, is_self=True))
    info = _dict(content.get("info"))
    mime = _str(info.get("mimetype")) or None
    url = _str(content.get("url")) or None
    if msgtype in ("m.text", "m.emote"):
        text = strip_reply_fallback(body) if reply else body
        parts.append(TextPart(text=f"* {text}" if msgtype == "m.emote" else text))
    elif msgtype == "m.image":
        parts.append(ImagePart(url=url, mime_type=mime))
    elif msgtype in _FILE_TYPES:
        size = info.get("size")
        name = _str(content.get("filename")) or body or f"{msgtype[2:]}-{event_id}"
        parts.append(
            FilePart(url=url, name=name, mime_type=mime, size=size if isinstance(size, int) else None)
        )
    elif msgtype == "m.location":
        parts.append(TextPart(text=f"[location] {body} {_str(content.get('geo_uri'))}".strip()))
    else:
        parts.append(TextPart(text=body or f"[{msgtype} message]"))
    if not direct and settings.require_mention_in_groups and not mentioned:
        return None
    # The event id: an edit, redaction or reaction of the message finds it by this.
    metadata: dict[str, Any] = {"reply_event_id": event_id, MESSAGE_REF_KEY: event_id}
    if not direct:
        metadata["reply_in_group"] = True
    return InboundEvent(
        channel="matrix",
        chat_id=room_id,
        sender_id=sender,
        thread_id=thread or None,
        chat_type=ChatType.DIRECT if direct else ChatType.GROUP,
        parts=tuple(parts),
        external_id=f"event:{event_id}",
        session_scope=settings.session_scope,
        metadata=metadata,
    )


def is_encryption(event: Any) -> bool:
    return isinstance(event, dict) and event.get("type") == "m.room.encryption"
