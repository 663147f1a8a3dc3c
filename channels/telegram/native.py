"""Telegram's platform-native events (docs/events.md): edits and inline-keyboard presses.

`edited_message` becomes an `edited` event naming the message by its `message_id`; a
`callback_query` becomes an `action` event (`approve:<id>` / `deny:<id>` from the buttons
`approval_keyboard` puts on an approval prompt); `message_reaction` (delivered only to
a bot that is an administrator of the group, or in private chats) becomes a `reaction`.
The query is answered when the reply to the press is sent: a refusal as a private alert
(`answerCallbackQuery` with `show_alert`), anything else in the chat, the query answered
without text so the button stops spinning.
"""

from __future__ import annotations

from telegram import (
    CallbackQuery,
    InlineKeyboardButton,
    InlineKeyboardMarkup,
    MessageReactionUpdated,
    ReactionTypeEmoji,
)

from app.events import (
    MESSAGE_REF_KEY,
    ChatType,
    InboundEvent,
    NativeEvent,
    NativeKind,
    SessionScope,
)

CHANNEL = "telegram"
# The reply metadata that carries the press's query id to the reply (`reply_` keys are copied).
CALLBACK_KEY = "reply_callback_query_id"


def edited(event: InboundEvent) -> InboundEvent:
    """The `edited` event of a message event parsed from an `edited_message` update."""
    ref = str(event.metadata[MESSAGE_REF_KEY])
    metadata = {k: v for k, v in event.metadata.items() if k != MESSAGE_REF_KEY}
    return InboundEvent.native(
        NativeEvent(kind=NativeKind.EDITED, target=ref),
        channel=event.channel,
        chat_id=event.chat_id,
        sender_id=event.sender_id,
        text=event.text,
        thread_id=event.thread_id,
        chat_type=event.chat_type,
        external_id=event.external_id,
        session_scope=event.session_scope,
        metadata=metadata,
    )


def button_press(update_id: int, query: CallbackQuery, scope: SessionScope) -> InboundEvent | None:
    """The `action` event of a press on one of our inline keyboards."""
    message = query.message
    if message is None or query.from_user is None or query.from_user.is_bot:
        return None
    chat = message.chat
    chat_type = ChatType.DIRECT if chat.type == "private" else ChatType.GROUP
    action, _, value = (query.data or "").partition(":")
    thread = getattr(message, "message_thread_id", None)
    is_topic = bool(getattr(message, "is_topic_message", False))
    metadata: dict[str, object] = {CALLBACK_KEY: query.id}
    if query.from_user.username:
        metadata["sender_username"] = query.from_user.username
    return InboundEvent.native(
        NativeEvent(
            kind=NativeKind.ACTION, target=str(message.message_id), action=action, value=value or None
        ),
        channel=CHANNEL,
        chat_id=str(chat.id),
        sender_id=str(query.from_user.id),
        thread_id=str(thread) if is_topic and thread else None,
        chat_type=chat_type,
        external_id=f"update:{update_id}",
        session_scope=scope,
        metadata=metadata,
    )


def reaction(update_id: int, change: MessageReactionUpdated, scope: SessionScope) -> InboundEvent | None:
    """The `reaction` event of a `message_reaction` update (the emoji added, else the one
    taken back; Telegram reports a member's whole set of reactions on the message)."""
    user = change.user
    if user is None or user.is_bot:
        return None  # anonymous (a channel or an anonymous admin) or a bot
    old = {r.emoji for r in change.old_reaction if isinstance(r, ReactionTypeEmoji)}
    new = {r.emoji for r in change.new_reaction if isinstance(r, ReactionTypeEmoji)}
    added, removed = sorted(new - old), sorted(old - new)
    if not added and not removed:
        return None  # custom or paid reactions only
    chat = change.chat
    metadata: dict[str, object] = {}
    if user.username:
        metadata["sender_username"] = user.username
    return InboundEvent.native(
        NativeEvent(
            kind=NativeKind.REACTION,
            target=str(change.message_id),
            emoji=(added or removed)[0],
            removed=not added,
        ),
        channel=CHANNEL,
        chat_id=str(chat.id),
        sender_id=str(user.id),
        chat_type=ChatType.DIRECT if chat.type == "private" else ChatType.GROUP,
        external_id=f"update:{update_id}",
        session_scope=scope,
        metadata=metadata,
    )


def approval_keyboard(approval_id: int | str, locale: str) -> InlineKeyboardMarkup:
    """Approve / deny buttons for an approval prompt."""
    approve, deny = ("✅ 批准", "❌ 拒绝") if locale == "zh" else ("✅ Approve", "❌ Deny")
    return InlineKeyboardMarkup(
        [
            [
                InlineKeyboardButton(approve, callback_data=f"approve:{approval_id}"),
                InlineKeyboardButton(deny, callback_data=f"deny:{approval_id}"),
            ]
        ]
    )
