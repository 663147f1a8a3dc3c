"""DingTalk group membership events over Stream mode (docs/events.md): joined and left.

DingTalk's event subscription ("事件订阅", chosen in the developer console) reports a
group's membership changes as 群会话事件, delivered over the Stream connection as EVENT
frames (`headers.eventType`, `headers.eventId`, `data` the event's JSON):

- `chat_add_member` (members added): `UserId` (a list), `OpenConversationId` (the group's
  `cid…`, the robot messages' `conversationId`), `Operator`, `ChatId` (the old API's
  `chat…` id), `TimeStamp`;
- `chat_remove_member` (members removed), the same fields;
- `chat_quit` (a member left by themselves): `Operator` is the member (`UserId` when given).

Each member becomes a `joined` or `left` event in the group's chat (`OpenConversationId`),
deduplicated on the event id and the member. An event without `OpenConversationId` names no
conversation the robot is in and is ignored, as is every other event type. DingTalk names
no display name: `{name}` in a welcome is the member's user id.
"""

from __future__ import annotations

from typing import Any

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind
from channels.dingtalk.parse import CHANNEL, GROUP
from channels.dingtalk.settings import DingTalkSettings

MEMBERSHIP = {
    "chat_add_member": NativeKind.JOINED,
    "chat_remove_member": NativeKind.LEFT,
    "chat_quit": NativeKind.LEFT,
}


def parse_event(
    event_type: str | None, event_id: str | None, data: Any, settings: DingTalkSettings
) -> list[InboundEvent]:
    """The membership events one DingTalk event stands for (none for any other event)."""
    kind = MEMBERSHIP.get(event_type or "")
    if kind is None or not event_id or not isinstance(data, dict):
        return []
    conversation = data.get("OpenConversationId")
    if not isinstance(conversation, str) or not conversation:
        return []
    members = data.get("UserId")
    if not isinstance(members, list) or not members:
        members = [data.get("Operator")] if event_type == "chat_quit" else []
    return [
        InboundEvent.native(
            NativeEvent(kind=kind),
            channel=CHANNEL,
            chat_id=conversation,
            sender_id=member,
            chat_type=ChatType.GROUP,
            external_id=f"event:{event_id}:{member}",
            session_scope=settings.session_scope,
            metadata={"reply_conversation_type": GROUP},
        )
        for member in dict.fromkeys(m for m in members if isinstance(m, str) and m)
    ]
