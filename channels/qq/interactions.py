"""QQ message-keyboard buttons (docs/events.md): approval prompts with Approve/Deny callback
buttons, and `INTERACTION_CREATE` (a press of a callback button) as an `action` event.

With `QQ_APPROVAL_BUTTONS` an approval prompt (`APPROVAL_KEY`) is sent as a markdown message
(`msg_type: 2`) with a custom keyboard of two callback buttons (`action.type: 1`) whose
data is `approve:<id>` / `deny:<id>`. Custom keyboards and markdown are permissions QQ
grants by invitation, so this is off by default (the prompt is text, `/approve <id>` typed).

A press arrives as `INTERACTION_CREATE` (`chat_type` 1: a group, `group_openid` and the
presser's `group_member_openid`; 2: a private chat, `user_openid`); it is accepted into
the inbox (deduplicated on the interaction id), then answered `PUT /interactions/{id}`
with `code: 0` (otherwise the button keeps spinning). Guild (频道) presses are not read:
this adapter does not serve guilds. Other buttons' data becomes an `action` note.
"""

from __future__ import annotations

from typing import Any

from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope

LABELS: dict[str, tuple[str, str]] = {"en": ("Approve", "Deny"), "zh": ("批准", "拒绝")}


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _button(button_id: str, label: str, data: str) -> dict[str, Any]:
    return {
        "id": button_id,
        "render_data": {"label": label, "visited_label": label, "style": 1},
        "action": {
            "type": 1,  # a callback button: the press comes back as INTERACTION_CREATE
            "permission": {"type": 2},  # anyone may press; who may decide is checked by us
            "data": data,
            "unsupport_tips": f"/{data.replace(':', ' ')}",
        },
    }


def approval_body(text: str, approval_id: Any, locale: str) -> dict[str, Any]:
    """A message body with the prompt as markdown and the Approve/Deny keyboard."""
    approve, deny = LABELS.get(locale, LABELS["en"])
    buttons = [
        _button("approve", approve, f"approve:{approval_id}"),
        _button("deny", deny, f"deny:{approval_id}"),
    ]
    return {
        "msg_type": 2,
        "markdown": {"content": text},
        "keyboard": {"content": {"rows": [{"buttons": buttons}]}},
    }


def parse_interaction(payload: dict[str, Any], *, channel: str, scope: SessionScope) -> InboundEvent | None:
    """The `action` event of a button press; None for presses this adapter does not serve."""
    d = payload.get("d")
    if not isinstance(d, dict):
        return None
    interaction = _str(d.get("id"))
    resolved = (d.get("data") or {}).get("resolved") if isinstance(d.get("data"), dict) else None
    resolved = resolved if isinstance(resolved, dict) else {}
    data, button = _str(resolved.get("button_data")), _str(resolved.get("button_id"))
    if d.get("chat_type") == 1:
        group, sender = _str(d.get("group_openid")), _str(d.get("group_member_openid"))
        chat_id, chat_type = f"group:{group}", ChatType.GROUP
        if not group:
            return None
    elif d.get("chat_type") == 2:
        sender = _str(d.get("user_openid"))
        chat_id, chat_type = f"user:{sender}", ChatType.DIRECT
    else:
        return None  # a guild (频道): not served here
    if not interaction or not sender or not (data or button):
        return None
    action, _, value = data.partition(":")
    if action in ("approve", "deny") and value.isdigit():
        native = NativeEvent(kind=NativeKind.ACTION, action=action, value=value)
    else:
        native = NativeEvent(kind=NativeKind.ACTION, action=button or None, value=data or None)
    return InboundEvent.native(
        native,
        channel=channel,
        chat_id=chat_id,
        sender_id=sender,
        chat_type=chat_type,
        external_id=f"interaction:{interaction}",
        session_scope=scope,
        # The interaction's id is a platform event id: replies to it are passive messages.
        metadata={"reply_event_id": interaction},
    )


__all__ = ["approval_body", "parse_interaction"]
