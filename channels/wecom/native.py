"""WeCom's platform-native events (docs/events.md): template card button presses.

An app may send a template card of type `button_interaction` (`cgi-bin/message/send`,
`msgtype: template_card`); a member's press is posted to the callback URL as the event
`template_card_event` with `EventKey` (the pressed button's `key`), `TaskId` (the card's
`task_id`), `CardType` and `ResponseCode` (a one-time credential to update the card,
which chatgate does not use). A press becomes an `action`: the key `approve:<id>` or
`deny:<id>` decides an approval (with `WECOM_APPROVAL_BUTTONS` approval prompts are
followed by such a card), any other key is a note for the model.

WeCom app callbacks are one member talking to the app, so the press's chat is the presser.
"""

from __future__ import annotations

import re
from typing import Any

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope
from channels.common.wechat_xml import WeChatMessage

CHANNEL = "wecom"
CARD_EVENT = "template_card_event"
_TASK_ID_UNSAFE = re.compile(r"[^0-9A-Za-z_\-@]")
MAX_TASK_ID = 128  # WeCom: digits, letters and "_-@", at most 128 bytes, unique per app


def card_press(message: WeChatMessage, *, scope: SessionScope, agent: str | None) -> InboundEvent | None:
    """The `action` of a `template_card_event`; None for a press without a key."""
    fields = message.fields
    key = fields.get("EventKey", "").strip()
    if not key:
        return None
    task = fields.get("TaskId", "").strip()
    action, _, value = key.partition(":")
    # One press per member, card and button: a repeated press (or WeCom's retry) is stored once.
    external = f"card:{task}:{message.from_user}:{key}" if task else message.dedup_id()
    metadata: dict[str, Any] = {"msg_type": message.msg_type, "event": message.event, "agent_id": agent}
    if task:
        metadata["task_id"] = task
    if fields.get("CardType"):
        metadata["card_type"] = fields["CardType"]
    return InboundEvent.native(
        NativeEvent(kind=NativeKind.ACTION, action=action, value=value or None),
        channel=CHANNEL,
        chat_id=message.from_user,
        sender_id=message.from_user,
        chat_type=ChatType.DIRECT,
        external_id=external[:255],
        session_scope=scope,
        metadata=metadata,
    )


def approval_card(approval_id: str, outbound_id: str, locale: str) -> dict[str, Any]:
    """A `button_interaction` template card with Approve / Deny (keys `approve:<id>`, `deny:<id>`)."""
    approve, deny = ("批准", "拒绝") if locale == "zh" else ("Approve", "Deny")
    title = f"审批 #{approval_id}" if locale == "zh" else f"Approval #{approval_id}"
    task_id = _TASK_ID_UNSAFE.sub("_", f"approval-{approval_id}-{outbound_id}")[:MAX_TASK_ID]
    return {
        "card_type": "button_interaction",
        "main_title": {"title": title},
        "task_id": task_id,
        "button_list": [
            {"text": approve, "style": 1, "key": f"approve:{approval_id}"},
            {"text": deny, "style": 2, "key": f"deny:{approval_id}"},
        ],
    }
