"""Discord payloads → `InboundEvent`s: Gateway MESSAGE_CREATE and slash-command interactions."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from app.errors import InvalidPayload
from app.events import MESSAGE_REF_KEY, ROLE_KEY, ChatType, FilePart, ImagePart, InboundEvent, Part, TextPart
from channels.discord.settings import DiscordSettings

CHANNEL = "discord"
# Channel types that are threads (public, private, announcement threads).
THREAD_TYPES = {10, 11, 12}


@dataclass(frozen=True)
class Parsed:
    event: InboundEvent | None = None
    ignored: str | None = None


def parse_message(
    data: dict[str, Any], settings: DiscordSettings, bot_id: str | None, *, parent_id: str | None = None
) -> Parsed:
    """A MESSAGE_CREATE dispatch. `parent_id`: the thread's parent channel when the message is in a thread."""
    author = data.get("author") or {}
    if author.get("bot") or (bot_id is not None and str(author.get("id")) == bot_id):
        return Parsed(ignored="message from a bot")
    message_id, channel_id = data.get("id"), data.get("channel_id")
    if not message_id or not channel_id or not author.get("id"):
        raise InvalidPayload("MESSAGE_CREATE without id, channel_id or author")
    guild = data.get("guild_id")
    chat_type = ChatType.GROUP if guild else ChatType.DIRECT
    text = str(data.get("content") or "")
    mentioned = bot_id is not None and any(str(m.get("id")) == bot_id for m in data.get("mentions") or [])
    if chat_type is ChatType.GROUP and settings.require_mention_in_groups and not mentioned:
        return Parsed(ignored="guild message without a mention of the bot")
    if bot_id is not None:
        text = re.sub(rf"<@!?{re.escape(bot_id)}>", "", text).strip()
    parts: list[Part] = [TextPart(text=text)] if text else []
    parts += _attachment_parts(data.get("attachments"))
    if not parts:
        return Parsed(ignored="no text or attachments")
    # In a thread the conversation is the thread; its parent channel is the chat.
    chat_id, thread_id = (parent_id, str(channel_id)) if parent_id else (str(channel_id), None)
    metadata: dict[str, Any] = {
        "reply_channel_id": str(channel_id),
        "discord_message_id": str(message_id),
        MESSAGE_REF_KEY: str(message_id),  # an edit, deletion or reaction of it finds its event
    }
    if guild:
        metadata["guild_id"] = str(guild)
    event = InboundEvent(
        channel=CHANNEL,
        chat_id=chat_id,
        sender_id=str(author["id"]),
        thread_id=thread_id,
        chat_type=chat_type,
        parts=tuple(parts),
        external_id=f"message:{message_id}",
        session_scope=settings.session_scope,
        metadata=metadata,
    )
    return Parsed(event=event)


def _attachment_parts(attachments: Any) -> list[Part]:
    """Attachments (`{id, filename, size, url, content_type}`): images to download, files as references."""
    parts: list[Part] = []
    for item in attachments if isinstance(attachments, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("url"), str):
            continue
        mime = item.get("content_type") if isinstance(item.get("content_type"), str) else None
        size = item.get("size") if isinstance(item.get("size"), int) else None
        if mime and mime.startswith("image/"):
            parts.append(ImagePart(url=item["url"], mime_type=mime))
        else:
            parts.append(FilePart(url=item["url"], name=item.get("filename"), mime_type=mime, size=size))
    return parts


def parse_command(data: dict[str, Any], settings: DiscordSettings) -> InboundEvent:
    """An APPLICATION_COMMAND interaction (type 2) → an event whose text is `/name options…`."""
    command = data.get("data") or {}
    name, interaction_id, token = command.get("name"), data.get("id"), data.get("token")
    channel = data.get("channel") or {}
    channel_id = data.get("channel_id") or channel.get("id")
    user = (data.get("member") or {}).get("user") or data.get("user") or {}
    if not name or not interaction_id or not token or not channel_id or not user.get("id"):
        raise InvalidPayload("application command without name, id, token, channel or user")
    options = " ".join(str(o.get("value")) for o in command.get("options") or [] if "value" in o)
    text = f"/{name} {options}".strip()
    in_thread = channel.get("type") in THREAD_TYPES and channel.get("parent_id")
    chat_id, thread_id = (
        (str(channel["parent_id"]), str(channel_id)) if in_thread else (str(channel_id), None)
    )
    metadata: dict[str, Any] = {
        "reply_channel_id": str(channel_id),
        "reply_interaction_token": str(token),
        "reply_application_id": str(data.get("application_id") or ""),
    }
    role = role_of((data.get("member") or {}).get("permissions"))
    if data.get("guild_id") and role is not None:
        metadata[ROLE_KEY] = role
    return InboundEvent(
        channel=CHANNEL,
        chat_id=chat_id,
        sender_id=str(user["id"]),
        thread_id=thread_id,
        chat_type=ChatType.GROUP if data.get("guild_id") else ChatType.DIRECT,
        parts=(TextPart(text=text),),
        external_id=f"interaction:{interaction_id}",
        session_scope=settings.session_scope,
        metadata=metadata,
    )


# Permission bits that make someone an admin of the guild's conversations
# (https://discord.com/developers/docs/topics/permissions): ADMINISTRATOR, MANAGE_GUILD.
_ADMIN_BITS = (1 << 3) | (1 << 5)


def role_of(permissions: Any) -> str | None:
    """A signed interaction's `member.permissions` (the member's total permissions in the
    channel, a decimal string) as a role (`app.access.roles`); None when absent."""
    if not isinstance(permissions, str) or not permissions.isdigit():
        return None
    return "admin" if int(permissions) & _ADMIN_BITS else "member"
