"""Telegram members joining and leaving groups as `joined` / `left` events (docs/events.md).

Telegram reports a membership change two ways, and a bot may get either or both:

- a `chat_member` update (the member's old and new status), sent only when
  `allowed_updates` asks for it and only to a bot that is an administrator of the group;
- the service messages `new_chat_members` / `left_chat_member`, sent to every bot in the
  group (unless the group hides join messages; several members added at once come as one
  message naming them all).

Both give the same `external_id` for the same change (chat, member, joined or left, and the
change's date in seconds), so a bot that gets both stores one event. `my_chat_member` (the
bot's own status) is not an event: a welcome for the bot itself means nothing, as on OneBot.
"""

from __future__ import annotations

from datetime import datetime

from telegram import ChatMember, ChatMemberRestricted, ChatMemberUpdated, Message, User

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope

CHANNEL = "telegram"
# The updates chatgate asks Telegram for (getUpdates and setWebhook): without `chat_member`
# in the list Telegram never sends member updates.
ALLOWED_UPDATES = ["message", "edited_message", "callback_query", "message_reaction", "chat_member"]

_MEMBER_STATUSES = (ChatMember.OWNER, ChatMember.ADMINISTRATOR, ChatMember.MEMBER)


def _is_member(member: ChatMember) -> bool:
    if isinstance(member, ChatMemberRestricted):
        return bool(member.is_member)  # restricted, and still (or not yet) in the group
    return member.status in _MEMBER_STATUSES


def _event(
    kind: NativeKind,
    chat_id: int,
    user: User,
    date: datetime,
    scope: SessionScope,
    operator: User | None,
) -> InboundEvent:
    metadata: dict[str, object] = {"sender_name": user.full_name}
    if user.username:
        metadata["sender_username"] = user.username
    if operator is not None and operator.id != user.id:
        metadata["operator_id"] = str(operator.id)  # an admin added or removed the member
    seconds = int(date.timestamp())
    return InboundEvent.native(
        NativeEvent(kind=kind, name=user.full_name),
        channel=CHANNEL,
        chat_id=str(chat_id),
        sender_id=str(user.id),
        chat_type=ChatType.GROUP,
        # The same change by either report is one event (see the module's docstring).
        external_id=f"member:{chat_id}:{user.id}:{kind.value}:{seconds}",
        session_scope=scope,
        metadata=metadata,
    )


def member_change(change: ChatMemberUpdated, scope: SessionScope) -> InboundEvent | None:
    """The `joined` / `left` event of a `chat_member` update; None for other changes
    (a promotion, a restriction of a member who stays), channels and bots."""
    user = change.new_chat_member.user
    if change.chat.type not in ("group", "supergroup") or user.is_bot:
        return None
    was, now = _is_member(change.old_chat_member), _is_member(change.new_chat_member)
    if was == now:
        return None
    kind = NativeKind.JOINED if now else NativeKind.LEFT
    return _event(kind, change.chat.id, user, change.date, scope, change.from_user)


def service_members(message: Message, scope: SessionScope) -> list[InboundEvent] | None:
    """The events of a `new_chat_members` / `left_chat_member` service message (bots left
    out: an empty list); None when the message is neither."""
    joined, left = message.new_chat_members, message.left_chat_member
    if not joined and left is None:
        return None
    if message.chat.type not in ("group", "supergroup"):
        return []
    if joined:
        kind, users = NativeKind.JOINED, list(joined)
    else:
        assert left is not None
        kind, users = NativeKind.LEFT, [left]
    return [
        _event(kind, message.chat.id, user, message.date, scope, message.from_user)
        for user in users
        if not user.is_bot
    ]
