"""LINE's platform-native events (docs/events.md).

- `unsend`: the sender withdrew a message (`unsend.messageId`) → `recalled`. LINE has no
  API to delete the bot's own messages, so our answer stays in the chat.
- `memberJoined` / `memberLeft` (groups and rooms): one `joined` / `left` event per member
  named (`joined.members`, `left.members`). LINE gives no display name in the event: the
  adapter asks for a joining member's (`with_name`) when a welcome text is set; otherwise,
  and for a member who left (LINE has no profile for them any more), it is the user id.
- `postback`: a press on a postback action → `action`. Approval prompts carry a confirm
  template with the postback data `approve:<id>` / `deny:<id>` (`approval_template`).

A postback or a join carries a reply token, so the answer to it is a free reply. A
refusal meant for the presser only (`PRIVATE_NOTICE_KEY`) is pushed to the presser's
one-to-one chat with the bot (`PRESSER_KEY`) instead of the group.
"""

from __future__ import annotations

from typing import Any

from app.events import NATIVE_KEY, ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope

CHANNEL = "line"
PRESSER_KEY = "reply_presser"  # the reply metadata naming who pressed a button
_MEMBERS = {"memberJoined": ("joined", NativeKind.JOINED), "memberLeft": ("left", NativeKind.LEFT)}
NATIVE_TYPES = frozenset({"unsend", "postback", *_MEMBERS})
MAX_TEMPLATE_TEXT = 240  # LINE: a confirm template's text


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def native_events(
    raw: dict[str, Any],
    *,
    chat_id: str,
    chat_type: ChatType,
    user: str,
    metadata: dict[str, Any],
    scope: SessionScope,
) -> list[InboundEvent]:
    """The native events of one webhook event of a type in `NATIVE_TYPES` (its source
    already read: `chat_id`, `chat_type`, the sender `user`, the reply `metadata`)."""
    kind = raw.get("type")
    event_id = _str(raw.get("webhookEventId"))
    common: dict[str, Any] = {
        "channel": CHANNEL,
        "chat_id": chat_id,
        "chat_type": chat_type,
        "session_scope": scope,
    }
    if kind == "unsend":
        unsend = raw.get("unsend")
        target = _str(unsend.get("messageId")) if isinstance(unsend, dict) else ""
        if not target or not user:
            return []
        return [
            InboundEvent.native(
                NativeEvent(kind=NativeKind.RECALLED, target=target),
                sender_id=user,
                external_id=f"event:{event_id}" if event_id else f"unsend:{target}",
                metadata=metadata,
                **common,
            )
        ]
    if kind == "postback":
        postback = raw.get("postback")
        data = _str(postback.get("data")) if isinstance(postback, dict) else ""
        if not data or not user or not event_id:
            return []
        action, _, value = data.partition(":")
        return [
            InboundEvent.native(
                NativeEvent(kind=NativeKind.ACTION, action=action, value=value or None),
                sender_id=user,
                external_id=f"event:{event_id}",
                metadata={**metadata, PRESSER_KEY: user},
                **common,
            )
        ]
    field, native_kind = _MEMBERS[str(kind)]
    if chat_type is not ChatType.GROUP:
        return []
    holder = raw.get(field)
    members = holder.get("members") if isinstance(holder, dict) else None
    out: list[InboundEvent] = []
    for member in members if isinstance(members, list) else []:
        member_id = _str(member.get("userId")) if isinstance(member, dict) else ""
        if not member_id:
            continue
        out.append(
            InboundEvent.native(
                NativeEvent(kind=native_kind, name=member_id),
                sender_id=member_id,
                external_id=f"event:{event_id}:{member_id}" if event_id else None,
                metadata=metadata,
                **common,
            )
        )
    return out


def with_name(event: InboundEvent, name: str) -> InboundEvent:
    """`event` (a `joined` event) naming the member `name`."""
    native = {**event.metadata[NATIVE_KEY], "name": name}
    return event.model_copy(update={"metadata": {**event.metadata, NATIVE_KEY: native}})


def approval_text(approval_id: int | str, locale: str) -> str:
    return f"审批 #{approval_id}" if locale == "zh" else f"Approval #{approval_id}"


def approval_labels(locale: str) -> tuple[str, str]:
    return ("批准", "拒绝") if locale == "zh" else ("Approve", "Deny")
