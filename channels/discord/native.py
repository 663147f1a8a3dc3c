"""Discord's platform-native events from the Gateway (docs/events.md).

- `MESSAGE_UPDATE` with new content → `edited` (gated like a message);
- `MESSAGE_DELETE` → `recalled` (Discord names the message, not its author:
  `NativeEvent.author_known` is False);
- `MESSAGE_REACTION_ADD` / `MESSAGE_REACTION_REMOVE` → `reaction` (the emoji's name:
  a unicode emoji, or a custom emoji's name).

Approval buttons: an approval prompt carries approve / deny buttons (`approval_components`,
`custom_id` `approve:<id>` / `deny:<id>`); a press arrives at the interactions endpoint as a
MESSAGE_COMPONENT interaction (`parse_component`) and becomes an `action` event by the member
who pressed. The interaction is acknowledged at once (type 6); a refusal is an ephemeral
follow-up through the interaction's webhook (flags 64), sent by the outbox.
"""

from __future__ import annotations

from typing import Any

from app.events import ROLE_KEY, ChatType, InboundEvent, NativeEvent, NativeKind
from channels.discord.parse import CHANNEL, THREAD_TYPES, parse_message, role_of
from channels.discord.settings import DiscordSettings

# `reply_…` keys travel with the replies to a press: a private notice is an ephemeral
# follow-up through this interaction's webhook (not `reply_interaction_token`, whose first
# reply edits the interaction's original answer — here the prompt itself).
COMPONENT_TOKEN_KEY = "reply_component_token"
COMPONENT_APP_KEY = "reply_component_app"
EPHEMERAL = 1 << 6
DELETE_SENDER = "discord:delete"  # the sender of a deletion: Discord does not name one
NATIVE_DISPATCHES = frozenset(
    {"MESSAGE_UPDATE", "MESSAGE_DELETE", "MESSAGE_REACTION_ADD", "MESSAGE_REACTION_REMOVE"}
)


def _where(data: dict[str, Any], parent_id: str | None) -> tuple[str, str | None, ChatType]:
    channel_id = str(data.get("channel_id") or "")
    chat_id, thread_id = (parent_id, channel_id) if parent_id else (channel_id, None)
    return chat_id, thread_id, ChatType.GROUP if data.get("guild_id") else ChatType.DIRECT


def parse_native(
    kind: str, data: dict[str, Any], settings: DiscordSettings, bot_id: str | None, *, parent_id: str | None
) -> InboundEvent | None:
    """The native event of a Gateway dispatch; None when it is none of ours."""
    if not data.get("channel_id"):
        return None
    chat_id, thread_id, chat_type = _where(data, parent_id)
    common: dict[str, Any] = dict(
        channel=CHANNEL,
        chat_id=chat_id,
        thread_id=thread_id,
        chat_type=chat_type,
        session_scope=settings.session_scope,
    )
    reply = {"reply_channel_id": str(data["channel_id"])}
    if kind == "MESSAGE_UPDATE":
        if "content" not in data or not data.get("edited_timestamp") or not data.get("author"):
            return None  # an embed unfurled, a pin …: not an edit by its author
        parsed = parse_message(data, settings, bot_id, parent_id=parent_id)
        if parsed.event is None:
            return None
        stamp = str(data.get("edited_timestamp"))
        return InboundEvent.native(
            NativeEvent(kind=NativeKind.EDITED, target=str(data["id"])),
            sender_id=parsed.event.sender_id,
            text=parsed.event.text,
            external_id=f"edit:{data['id']}:{stamp}",
            metadata=reply,
            **common,
        )
    if kind == "MESSAGE_DELETE":
        if not data.get("id"):
            return None
        return InboundEvent.native(
            NativeEvent(kind=NativeKind.RECALLED, target=str(data["id"]), author_known=False),
            sender_id=DELETE_SENDER,
            external_id=f"delete:{data['id']}",
            metadata=reply,
            **common,
        )
    user, message_id = data.get("user_id"), data.get("message_id")
    emoji = (data.get("emoji") or {}).get("name")
    if not user or not message_id or not emoji or str(user) == bot_id:
        return None
    removed = kind == "MESSAGE_REACTION_REMOVE"
    return InboundEvent.native(
        NativeEvent(kind=NativeKind.REACTION, target=str(message_id), emoji=str(emoji), removed=removed),
        sender_id=str(user),
        external_id=f"reaction:{message_id}:{user}:{emoji}:{'-' if removed else '+'}:{data.get('burst', '')}",
        metadata=reply,
        **common,
    )


def approval_components(approval_id: Any, locale: str) -> list[dict[str, Any]]:
    """An action row with approve / deny buttons (Discord component types 1 and 2)."""
    approve, deny = ("批准", "拒绝") if locale == "zh" else ("Approve", "Deny")
    buttons = [
        {"type": 2, "style": 3, "label": approve, "custom_id": f"approve:{approval_id}"},  # green
        {"type": 2, "style": 4, "label": deny, "custom_id": f"deny:{approval_id}"},  # red
    ]
    return [{"type": 1, "components": buttons}]


def parse_component(data: dict[str, Any], settings: DiscordSettings) -> InboundEvent | None:
    """A MESSAGE_COMPONENT interaction (type 3) on a button of ours → an `action` event."""
    component = data.get("data") or {}
    custom_id, interaction_id, token = component.get("custom_id"), data.get("id"), data.get("token")
    message = data.get("message") or {}
    channel = data.get("channel") or {}
    channel_id = data.get("channel_id") or channel.get("id")
    user = (data.get("member") or {}).get("user") or data.get("user") or {}
    if not isinstance(custom_id, str) or not interaction_id or not token or not channel_id:
        return None
    if not user.get("id") or not message.get("id") or user.get("bot"):
        return None
    action, _, value = custom_id.partition(":")
    in_thread = channel.get("type") in THREAD_TYPES and channel.get("parent_id")
    chat_id, thread_id = (
        (str(channel["parent_id"]), str(channel_id)) if in_thread else (str(channel_id), None)
    )
    metadata: dict[str, Any] = {
        "reply_channel_id": str(channel_id),
        COMPONENT_TOKEN_KEY: str(token),
        COMPONENT_APP_KEY: str(data.get("application_id") or ""),
    }
    if user.get("username"):
        metadata["sender_username"] = str(user["username"])
    role = role_of((data.get("member") or {}).get("permissions"))
    if data.get("guild_id") and role is not None:
        metadata[ROLE_KEY] = role
    return InboundEvent.native(
        NativeEvent(kind=NativeKind.ACTION, target=str(message["id"]), action=action, value=value or None),
        channel=CHANNEL,
        chat_id=chat_id,
        sender_id=str(user["id"]),
        thread_id=thread_id,
        chat_type=ChatType.GROUP if data.get("guild_id") else ChatType.DIRECT,
        external_id=f"interaction:{interaction_id}",
        session_scope=settings.session_scope,
        metadata=metadata,
    )
