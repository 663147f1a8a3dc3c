"""Telegram updates → `InboundEvent`s: chat types, mention gating, topics and media."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from telegram import Bot, Message, MessageEntity, Update

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
from channels.telegram.members import member_change, service_members
from channels.telegram.native import button_press, edited, reaction
from channels.telegram.settings import TelegramSettings

CHANNEL = "telegram"
# Media parts carry Telegram's file_id; the file itself needs getFile with the bot token,
# which must never be stored, so the URL is this pseudo-scheme, not a download URL.
FILE_URL_PREFIX = "telegram-file:"


@dataclass(frozen=True)
class BotIdentity:
    id: int | None
    username: str | None

    def is_me(self, user: Any) -> bool:
        if user is None:
            return False
        if self.id is not None:
            return bool(user.id == self.id)
        return bool(self.username and user.username and user.username.lower() == self.username.lower())


@dataclass(frozen=True)
class Parsed:
    """What one update amounts to: an event to accept, or the reason it is ignored."""

    update_id: int
    event: InboundEvent | None = None
    ignored: str | None = None
    more: tuple[InboundEvent, ...] = ()  # further events of the same update (members added at once)

    @property
    def events(self) -> list[InboundEvent]:
        return [self.event, *self.more] if self.event is not None else []


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_update(data: Any, bot: Bot | None, settings: TelegramSettings, me: BotIdentity) -> Parsed:
    if not isinstance(data, dict) or not isinstance(data.get("update_id"), int):
        raise InvalidPayload("an update must be a JSON object with an integer update_id")
    try:
        update = Update.de_json(data, bot)
        message = update.message
        if update.edited_message is not None:
            # Gated like a message (a group edit not addressed to the bot is ignored).
            parsed = _parse_message(update.update_id, update.edited_message, settings, me)
            if parsed.event is None:
                return parsed
            return Parsed(update.update_id, event=edited(parsed.event))
        if update.message_reaction is not None:
            change = reaction(update.update_id, update.message_reaction, settings.session_scope)
            if change is None:
                return Parsed(update.update_id, ignored="a reaction without a member or an emoji")
            return Parsed(update.update_id, event=change)
        if update.callback_query is not None:
            event = button_press(update.update_id, update.callback_query, settings.session_scope)
            if event is None:
                return Parsed(update.update_id, ignored="a button press without a message")
            return Parsed(update.update_id, event=event)
        if update.chat_member is not None:  # joins and leaves (docs/events.md)
            change = member_change(update.chat_member, settings.session_scope)
            if change is None:
                return Parsed(update.update_id, ignored="a member update that is no join or leave")
            return Parsed(update.update_id, event=change)
        if update.my_chat_member is not None:
            return Parsed(update.update_id, ignored="the bot's own membership")
        if message is None:
            # Channel posts, reaction counts …: acknowledged so Telegram stops retrying.
            return Parsed(update.update_id, ignored="not a new message")
        members = service_members(message, settings.session_scope)
        if members is not None:  # new_chat_members / left_chat_member service messages
            if not members:
                return Parsed(update.update_id, ignored="a membership change of bots only")
            return Parsed(update.update_id, event=members[0], more=tuple(members[1:]))
        return _parse_message(update.update_id, message, settings, me)
    except InvalidPayload:
        raise
    except Exception as exc:  # any shape PTB or we cannot read is the sender's error, not ours
        raise InvalidPayload(f"not a Telegram update: {exc!r}") from exc


def _parse_message(update_id: int, message: Message, settings: TelegramSettings, me: BotIdentity) -> Parsed:
    sender = message.from_user
    if sender is None:
        return Parsed(update_id, ignored="anonymous sender")
    if sender.is_bot or me.is_me(sender):
        return Parsed(update_id, ignored="message from a bot")
    chat = message.chat
    # PTB keeps whatever JSON gave; ids become key components, so they must be integers.
    for name, value in (("chat.id", chat.id), ("from.id", sender.id), ("message_id", message.message_id)):
        if not _is_int(value):
            raise InvalidPayload(f"{name} must be an integer")
    if message.message_thread_id is not None and not _is_int(message.message_thread_id):
        raise InvalidPayload("message_thread_id must be an integer")
    if chat.type == "private":
        chat_type = ChatType.DIRECT
    elif chat.type in ("group", "supergroup"):
        chat_type = ChatType.GROUP
    else:
        return Parsed(update_id, ignored=f"chat type {chat.type}")

    text = message.text if message.text is not None else (message.caption or "")
    mentioned = _mentions_me(message, me)
    replied_to_me = _replies_to_me(message, me)
    if (
        chat_type is ChatType.GROUP
        and settings.require_mention_in_groups
        and not (mentioned or replied_to_me)
    ):
        return Parsed(update_id, ignored="group message without a mention of the bot")

    parts: list[Part] = []
    clean = _strip_self_mention(text, me).strip() if mentioned else text
    if clean:
        parts.append(TextPart(text=clean))
    if mentioned and me.id is not None:
        parts.append(MentionPart(user_id=str(me.id), is_self=True))
    reply = message.reply_to_message
    if reply is not None and reply.forum_topic_created is None:
        parts.append(ReplyToPart(message_id=str(reply.message_id)))
    if message.photo:
        largest = max(message.photo, key=lambda p: (p.width * p.height, p.file_size or 0))
        parts.append(ImagePart(url=FILE_URL_PREFIX + largest.file_id, mime_type="image/jpeg"))
    if message.document is not None:
        doc = message.document
        if (doc.mime_type or "").startswith("image/"):
            parts.append(ImagePart(url=FILE_URL_PREFIX + doc.file_id, mime_type=doc.mime_type))
        else:
            parts.append(
                FilePart(
                    url=FILE_URL_PREFIX + doc.file_id,
                    name=doc.file_name,
                    mime_type=doc.mime_type,
                    size=doc.file_size,
                )
            )
    if message.voice is not None:
        voice = message.voice
        parts.append(
            FilePart(
                url=FILE_URL_PREFIX + voice.file_id,
                name="voice.ogg",
                mime_type=voice.mime_type or "audio/ogg",
                size=voice.file_size,
            )
        )
    if not parts:
        return Parsed(update_id, ignored="no text or media")

    # Forum topics are threads; other supergroup messages may carry a reply-thread id
    # that is not a topic, so only topic messages set thread_id.
    thread_id = (
        str(message.message_thread_id) if message.is_topic_message and message.message_thread_id else None
    )
    # MESSAGE_REF_KEY: a later edit of the message finds its event (docs/events.md).
    metadata: dict[str, Any] = {
        "telegram_message_id": message.message_id,
        MESSAGE_REF_KEY: str(message.message_id),
    }
    if sender.username:
        metadata["sender_username"] = sender.username
    if chat_type is ChatType.GROUP and settings.quote_in_groups:
        metadata["reply_msg_id"] = message.message_id
    event = InboundEvent(
        channel=CHANNEL,
        chat_id=str(chat.id),
        sender_id=str(sender.id),
        thread_id=thread_id,
        chat_type=chat_type,
        parts=tuple(parts),
        external_id=f"update:{update_id}",
        session_scope=settings.session_scope,
        metadata=metadata,
    )
    return Parsed(update_id, event=event)


def _entities(message: Message) -> dict[MessageEntity, str]:
    types: list[str | None] = [MessageEntity.MENTION, MessageEntity.TEXT_MENTION, MessageEntity.BOT_COMMAND]
    if message.text is not None:
        return message.parse_entities(types)
    if message.caption is not None:
        return message.parse_caption_entities(types)
    return {}


def _mentions_me(message: Message, me: BotIdentity) -> bool:
    handle = f"@{me.username}".lower() if me.username else None
    for entity, value in _entities(message).items():
        if entity.type == MessageEntity.MENTION and handle and value.lower() == handle:
            return True
        if entity.type == MessageEntity.TEXT_MENTION and me.is_me(entity.user):
            return True
        if entity.type == MessageEntity.BOT_COMMAND and handle and value.lower().endswith(handle):
            return True
    return False


def _replies_to_me(message: Message, me: BotIdentity) -> bool:
    reply = message.reply_to_message
    # In forum topics every message "replies" to the topic's creation message.
    return reply is not None and reply.forum_topic_created is None and me.is_me(reply.from_user)


def _strip_self_mention(text: str, me: BotIdentity) -> str:
    """`@bot hello` → `hello`; `/new@bot` → `/new` (so session commands work in groups)."""
    if not me.username:
        return text
    name = re.escape(me.username)
    text = re.sub(rf"^(/\w+)@{name}\b", r"\1", text, flags=re.IGNORECASE)
    return re.sub(rf"(?<!\w)@{name}\b", "", text, flags=re.IGNORECASE).replace("  ", " ")
