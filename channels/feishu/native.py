"""Feishu approval buttons (docs/events.md): an interactive card out, `card.action.trigger` in.

An approval prompt (`APPROVAL_KEY`) is sent as an interactive card with approve / deny
buttons (`approval_card`). Each button's `value` names the action, the approval, the
prompt's session and the chat's type: Feishu's callback names the chat and the message but
not the chat's type nor its thread, and the press must reach the session the prompt belongs
to (whoever pressed, whatever the session scope). The values come back as
we sent them (the callback is signed and encrypted like every event), so they are trusted
as much as the callback itself.

A press (`card.action.trigger`, event subscription schema 2.0, same token, signature and
encryption as messages) becomes an `action` event by the member who pressed
(`event.operator.open_id`); the callback's answer can carry a toast, which is how a refused
press is told privately (`CARD_WAIT_SECONDS`, the adapter).
"""

from __future__ import annotations

import json
from typing import Any

import structlog

from app.channel import SendResult
from app.errors import DeliveryError, InvalidPayload
from app.events import APPROVAL_KEY, ChatType, InboundEvent, NativeEvent, NativeKind, OutboundMessage
from channels.feishu.outbound import FeishuOutbound
from channels.feishu.parse import CHANNEL, Parsed
from channels.feishu.reactions import MessageLocator
from channels.feishu.settings import FeishuSettings

log = structlog.get_logger(__name__)

CARD_ACTION = "card.action.trigger"
CARD_PRESS_KEY = "reply_feishu_card_press"
# Feishu waits 3 s for a card callback's answer; a refusal decided by then is its toast.
CARD_WAIT_SECONDS = 2.5


def approval_card(text: str, approval_id: Any, locale: str, *, session: str | None, chat_type: str) -> str:
    """The prompt's text with approve / deny buttons, as an interactive message's `content`."""
    approve, deny = ("批准", "拒绝") if locale == "zh" else ("Approve", "Deny")

    def button(label: str, action: str, style: str) -> dict[str, Any]:
        value: dict[str, Any] = {"action": action, "approval_id": str(approval_id), "chat_type": chat_type}
        if session:
            value["session"] = session
        return {
            "tag": "button",
            "text": {"tag": "plain_text", "content": label},
            "type": style,
            "value": value,
        }

    card = {
        "config": {"wide_screen_mode": True, "update_multi": True},
        "elements": [
            {"tag": "div", "text": {"tag": "plain_text", "content": text}},
            {
                "tag": "action",
                "actions": [button(approve, "approve", "primary"), button(deny, "deny", "danger")],
            },
        ],
    }
    return json.dumps(card, ensure_ascii=False)


def parse_card_action(payload: dict[str, Any], settings: FeishuSettings) -> Parsed:
    """`card.action.trigger` → an `action` event by the member who pressed."""
    header, body = payload.get("header"), payload.get("event")
    if not isinstance(header, dict) or not isinstance(body, dict):
        raise InvalidPayload("a schema 2.0 event needs a header and an event object")
    operator, action, context = body.get("operator"), body.get("action"), body.get("context")
    if not isinstance(operator, dict) or not isinstance(action, dict) or not isinstance(context, dict):
        raise InvalidPayload("card.action.trigger needs event.operator, event.action and event.context")
    event_id = header.get("event_id")
    open_id, chat_id = operator.get("open_id"), context.get("open_chat_id")
    message_id = context.get("open_message_id")
    if not all(isinstance(v, str) and v for v in (event_id, open_id, chat_id, message_id)):
        raise InvalidPayload(
            "card.action.trigger needs event_id, operator.open_id and the card's chat and message"
        )
    value = action.get("value")
    if not isinstance(value, dict) or not isinstance(value.get("action"), str):
        return Parsed(ignored="a card action that is not one of our buttons")
    session = value.get("session")
    return Parsed(
        event=InboundEvent.native(
            NativeEvent(
                kind=NativeKind.ACTION,
                target=str(message_id),
                action=value["action"],
                value=str(value.get("approval_id") or "") or None,
            ),
            channel=CHANNEL,
            chat_id=str(chat_id),
            sender_id=str(open_id),
            session_key_override=session if isinstance(session, str) and session else None,
            chat_type=ChatType.DIRECT if value.get("chat_type") == "p2p" else ChatType.GROUP,
            external_id=str(event_id),
            session_scope=settings.session_scope,
            # Travels with the replies: a refusal of this press is the callback's toast.
            metadata={"feishu_event_id": event_id, CARD_PRESS_KEY: True},
        )
    )


class ApprovalCards:
    """Approval prompts sent as cards with approve / deny buttons; where each card went is
    kept for a reaction on it (`channels.feishu.reactions`)."""

    def __init__(self, outbound: FeishuOutbound, settings: FeishuSettings, locator: MessageLocator) -> None:
        self.outbound = outbound
        self.settings = settings
        self.locator = locator

    async def send(self, message: OutboundMessage) -> SendResult:
        """The prompt as an interactive card; a prompt longer than one message is sent as
        text, followed by a short card with the buttons."""
        chunks = self.outbound.chunks(message)
        if len(chunks) > 1:
            items = [*chunks, "card"]
            card_text = self._label(message)
        else:
            items, card_text = ["card"], message.text
        content = self._content(message, card_text)

        async def post(index: int, _item: str) -> str | None:
            if index < len(items) - 1:
                return await self.outbound.deliver_step(message, index, chunks, [])
            uuid = f"{message.message_id}-card"
            return await self.outbound.post_message(message, "interactive", content, uuid=uuid)

        sent = await self.outbound.steps(message.message_id, items, post)
        result = SendResult(platform_message_id=next((m for m in sent if m), None))
        await self._remember(message, sent[-1] if sent else None, result)
        return result

    async def after_preview(self, message: OutboundMessage, result: SendResult) -> None:
        """An approval prompt that ends a preview (a text message or a streaming card, which
        cannot become a card with buttons) is followed by a short card with the buttons."""
        if APPROVAL_KEY not in message.metadata:
            return
        content = self._content(message, self._label(message))
        try:  # Feishu sends one message per uuid within an hour: a retried finish posts it once
            card = await self.outbound.post_message(
                message, "interactive", content, uuid=f"{message.message_id}-card"
            )
        except DeliveryError as exc:  # the prompt is there; the typed command still works
            log.warning("feishu_approval_buttons_failed", error=exc.detail)
            return
        await self._remember(message, card, result)

    async def _remember(self, message: OutboundMessage, card: str | None, result: SendResult) -> None:
        if card:
            await self.locator.remember_card(
                card,
                session_key=message.session_key,
                chat_id=message.chat_id,
                chat_type=_chat_type(message),
                target=result.platform_message_id,
            )

    def _label(self, message: OutboundMessage) -> str:
        approval_id = message.metadata[APPROVAL_KEY]
        return f"审批 #{approval_id}" if self.settings.locale == "zh" else f"Approval #{approval_id}"

    def _content(self, message: OutboundMessage, text: str) -> str:
        return approval_card(
            text,
            message.metadata[APPROVAL_KEY],
            self.settings.locale,
            session=message.session_key,
            chat_type=_chat_type(message),
        )


def _chat_type(message: OutboundMessage) -> str:
    return str(message.metadata.get("reply_feishu_chat_type") or "group")
