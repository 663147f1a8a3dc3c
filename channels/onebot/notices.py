"""OneBot v11 notices as platform-native events (docs/events.md).

- `group_recall` / `friend_recall`: the message `message_id` was recalled → `recalled`
  (its author is the event's sender, whoever recalled it: an admin may recall a member's);
- `group_increase` / `group_decrease`: a member joined or left (or was removed) →
  `joined` / `left`.

Other notices (pokes, uploads, bans, honours …) are acknowledged and ignored. Our own
recalls and our own membership changes are not events.
"""

from __future__ import annotations

from typing import Any

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope

_KINDS = {
    "group_recall": NativeKind.RECALLED,
    "friend_recall": NativeKind.RECALLED,
    "group_increase": NativeKind.JOINED,
    "group_decrease": NativeKind.LEFT,
}


def _text_id(value: Any) -> str | None:
    if value is None or isinstance(value, bool) or not isinstance(value, int | str) or not str(value).strip():
        return None
    return str(value).strip()


def parse_notice(
    data: dict[str, Any], self_id: str, *, channel: str, scope: SessionScope
) -> InboundEvent | None:
    """The native event of a notice; None for notices that are none (or are about us)."""
    kind = _KINDS.get(str(data.get("notice_type")))
    user_id = _text_id(data.get("user_id"))
    if kind is None or user_id is None or user_id == self_id:
        return None
    notice = str(data["notice_type"])
    if notice == "friend_recall":
        chat_id, chat_type = f"private:{user_id}", ChatType.DIRECT
    else:
        group_id = _text_id(data.get("group_id"))
        if group_id is None:
            return None
        chat_id, chat_type = f"group:{group_id}", ChatType.GROUP
    message_id = _text_id(data.get("message_id"))
    if kind is NativeKind.RECALLED and message_id is None:
        return None
    operator = _text_id(data.get("operator_id"))
    # Redelivered notices are the same event: a recall is once per message, a membership
    # change once per (member, time).
    if kind is NativeKind.RECALLED:
        external = f"{self_id}:recall:{message_id}"
    else:
        external = f"{self_id}:{notice}:{chat_id}:{user_id}:{data.get('time', '')}"
    metadata: dict[str, Any] = {
        "reply_self_id": self_id,
        "reply_message_type": "group" if chat_type is ChatType.GROUP else "private",
    }
    if operator is not None:
        metadata["operator_id"] = operator
    return InboundEvent.native(
        NativeEvent(kind=kind, target=message_id if kind is NativeKind.RECALLED else None),
        channel=channel,
        chat_id=chat_id,
        sender_id=user_id,
        chat_type=chat_type,
        external_id=external,
        session_scope=scope,
        metadata=metadata,
    )
