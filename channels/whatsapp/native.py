"""WhatsApp Cloud API messages that are platform-native events (docs/events.md).

- `reaction` (`reaction.message_id`, `reaction.emoji`; no emoji: the reaction was taken
  back) → `reaction`; ✅/❌ on an approval prompt decides it.
- `interactive` with a `button_reply` → `action`: the reply id `approve:<id>` /
  `deny:<id>` of the reply buttons an approval prompt carries (`approval_interactive`),
  or any other id (a note for the model).
- `edit` (`edit.original_message_id`, `edit.message`) → `edited`, and `revoke`
  (`revoke.original_message_id`) → `recalled`. Meta publishes these two for numbers also
  used in the WhatsApp Business app ("Coexistence") only; other numbers never get them.

WhatsApp cannot delete a message for the user by API, so our answer to a revoked message
stays. A refused press is answered in the chat it was made in: a group member's own chat
with the number may be outside the customer-service window, so nothing private is tried.
"""

from __future__ import annotations

from typing import Any

from app.events import NativeEvent, NativeKind

NATIVE_TYPES = frozenset({"reaction", "interactive", "edit", "revoke"})
MAX_BODY = 1024  # interactive message body text
_TITLES = {"en": ("Approve", "Deny"), "zh": ("批准", "拒绝")}


def _str(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def native_of(kind: str, message: dict[str, Any]) -> tuple[NativeEvent, str] | None:
    """(the native event, an edit's new text) of a message of a type in `NATIVE_TYPES`;
    None when it is none (a list reply is a message)."""
    body = _dict(message.get(kind))
    if kind == "reaction":
        target, emoji = _str(body.get("message_id")), _str(body.get("emoji"))
        if not target:
            return None
        native = NativeEvent(kind=NativeKind.REACTION, target=target, emoji=emoji or None, removed=not emoji)
        return native, ""
    if kind == "interactive":
        reply = _dict(body.get("button_reply"))
        data = _str(reply.get("id"))
        if not data:
            return None
        action, _, value = data.partition(":")
        context = _str(_dict(message.get("context")).get("id")) or None
        native = NativeEvent(
            kind=NativeKind.ACTION,
            target=context,
            action=action,
            value=value or _str(reply.get("title")) or None,
        )
        return native, ""
    original = _str(body.get("original_message_id"))
    if not original:
        return None
    if kind == "revoke":
        return NativeEvent(kind=NativeKind.RECALLED, target=original), ""
    edited = _dict(body.get("message"))
    inner = _dict(edited.get(_str(edited.get("type")) or "text"))
    text = _str(inner.get("body")) or _str(inner.get("caption"))
    return NativeEvent(kind=NativeKind.EDITED, target=original), text


def approval_interactive(target: dict[str, str], text: str, approval_id: str, locale: str) -> dict[str, Any]:
    """An interactive message with approve / deny reply buttons (`text` ≤ `MAX_BODY`)."""
    approve, deny = _TITLES.get(locale, _TITLES["en"])
    buttons = [
        {"type": "reply", "reply": {"id": f"approve:{approval_id}", "title": approve}},
        {"type": "reply", "reply": {"id": f"deny:{approval_id}", "title": deny}},
    ]
    return {
        **target,
        "type": "interactive",
        "interactive": {"type": "button", "body": {"text": text}, "action": {"buttons": buttons}},
    }


def approval_title(approval_id: str, locale: str) -> str:
    return f"审批 #{approval_id}" if locale == "zh" else f"Approval #{approval_id}"


__all__ = ["NATIVE_TYPES", "approval_interactive", "approval_title", "native_of"]
