"""Cloud API webhook payloads → events and delivery statuses.

A webhook is `{"object": "whatsapp_business_account", "entry": [{"changes": [{"field":
"messages", "value": {...}}]}]}`; a value carries `messages` (what users sent, with
`contacts`) or `statuses` (what became of what we sent), and `metadata.phone_number_id`
(the business number it concerns). Chat ids: a direct chat is the sender's `wa_id`; a
group message (it carries `group_id`) is `group:<group_id>`.
"""

from __future__ import annotations

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
    Part,
    SessionScope,
    TextPart,
)
from channels.whatsapp.native import NATIVE_TYPES, native_of

MEDIA_PREFIX = "whatsapp-media:"  # a part's url until the media id is downloaded
GROUP_PREFIX = "group:"
_FILE_TYPES = ("document", "audio", "video")


@dataclass(frozen=True)
class Inbound:
    event: InboundEvent
    sent_at: float  # the user's message time (unix seconds): opens the customer-service window


@dataclass(frozen=True)
class Status:
    platform_message_id: str
    status: str  # sent, delivered, read, failed
    recipient: str
    error: str | None = None


@dataclass(frozen=True)
class Webhook:
    messages: list[Inbound]
    statuses: list[Status]


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else str(value) if isinstance(value, int) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def parse(
    payload: Any, *, phone_number_id: str | None, scope: SessionScope, require_mention: bool = True
) -> Webhook:
    """`require_mention`: a group message is kept only when it @-mentions the business
    number or replies to one of its messages."""
    if not isinstance(payload, dict) or not isinstance(payload.get("entry"), list):
        raise InvalidPayload("expected a WhatsApp webhook: an object with entry[]")
    messages: list[Inbound] = []
    statuses: list[Status] = []
    for entry in _dicts(payload["entry"]):
        for change in _dicts(entry.get("changes")):
            value = change.get("value")
            if change.get("field") != "messages" or not isinstance(value, dict):
                continue
            meta = _dict(value.get("metadata"))
            # One app may serve several numbers; only ours is answered from here.
            if phone_number_id and _str(meta.get("phone_number_id")) not in ("", phone_number_id):
                continue
            names = {
                _str(c.get("wa_id")): _str(_dict(c.get("profile")).get("name"))
                for c in _dicts(value.get("contacts"))
            }
            own = "".join(ch for ch in _str(meta.get("display_phone_number")) if ch.isdigit())
            for message in _dicts(value.get("messages")):
                inbound = _message(message, names, scope, own, require_mention)
                if inbound is not None:
                    messages.append(inbound)
            statuses.extend(_status(s) for s in _dicts(value.get("statuses")) if _str(s.get("id")))
    return Webhook(messages, statuses)


def _message(
    message: dict[str, Any], names: dict[str, str], scope: SessionScope, own: str, require_mention: bool
) -> Inbound | None:
    sender, message_id, kind = _str(message.get("from")), _str(message.get("id")), _str(message.get("type"))
    if not sender or not message_id:
        raise InvalidPayload("a message without from or id")
    group = _str(message.get("group_id"))
    chat_id, chat_type = (f"{GROUP_PREFIX}{group}", ChatType.GROUP) if group else (sender, ChatType.DIRECT)
    sent_at = _sent_at(message)
    found = native_of(kind, message) if kind in NATIVE_TYPES else None
    if found is not None:  # no mention needed: it is about a message already there
        native, text = found
        metadata: dict[str, Any] = {"reply_message_id": message_id}
        if names.get(sender):
            metadata["sender_name"] = names[sender]
        native_event = InboundEvent.native(
            native,
            channel="whatsapp",
            chat_id=chat_id,
            sender_id=sender,
            text=text,
            chat_type=chat_type,
            external_id=message_id,
            session_scope=scope,
            metadata=metadata,
        )
        return Inbound(native_event, sent_at)
    parts = _parts(kind, message)
    if not parts:
        return None  # system notices, unsupported types: nothing to answer
    if group:
        # WhatsApp writes a mention into the text as "@<phone number>"; a reply names the
        # author of the quoted message in context.from.
        text = " ".join(p.text for p in parts if isinstance(p, TextPart))
        quoted = "".join(ch for ch in _str(_dict(message.get("context")).get("from")) if ch.isdigit())
        mentioned = bool(own) and (f"@{own}" in text.replace(" ", "") or quoted == own)
        if mentioned:
            parts.append(MentionPart(user_id=own, is_self=True))
        elif require_mention:
            return None
    metadata = {"reply_message_id": message_id, MESSAGE_REF_KEY: message_id}
    if names.get(sender):
        metadata["sender_name"] = names[sender]
    event = InboundEvent(
        channel="whatsapp",
        chat_id=chat_id,
        sender_id=sender,
        chat_type=chat_type,
        parts=tuple(parts),
        external_id=message_id,
        session_scope=scope,
        metadata=metadata,
    )
    return Inbound(event, sent_at)


def _sent_at(message: dict[str, Any]) -> float:
    try:
        return float(_str(message.get("timestamp")) or 0)
    except ValueError:
        return 0.0


def _parts(kind: str, message: dict[str, Any]) -> list[Part]:
    body = _dict(message.get(kind))
    if kind == "text":
        return [TextPart(text=_str(body.get("body")))]
    if kind == "button":  # a template's quick-reply button
        return [TextPart(text=_str(body.get("text")))]
    if kind == "interactive":
        reply = _dict(body.get("button_reply") or body.get("list_reply"))
        return [TextPart(text=_str(reply.get("title")))] if reply else []
    media_id = _str(body.get("id"))
    if kind in ("image", "sticker", *_FILE_TYPES) and media_id:
        parts: list[Part] = []
        caption = _str(body.get("caption"))
        if caption:
            parts.append(TextPart(text=caption))
        mime = _str(body.get("mime_type")) or None
        if kind in ("image", "sticker"):
            parts.append(ImagePart(url=MEDIA_PREFIX + media_id, mime_type=mime))
        else:
            name = _str(body.get("filename")) or f"{kind}-{media_id}"
            parts.append(FilePart(url=MEDIA_PREFIX + media_id, name=name, mime_type=mime))
        return parts
    return []


def _status(status: dict[str, Any]) -> Status:
    errors = _dicts(status.get("errors"))
    error = None
    if errors:
        first = errors[0]
        details = _dict(first.get("error_data")).get("details")
        error = " ".join(
            p
            for p in (
                _str(first.get("code")),
                _str(first.get("title")),
                _str(details or first.get("message")),
            )
            if p
        )
    return Status(
        platform_message_id=_str(status.get("id")),
        status=_str(status.get("status")),
        recipient=_str(status.get("recipient_id")),
        error=error,
    )
