"""Slack's platform-native events (docs/events.md), from the Events API and interactivity.

- `reaction_added` / `reaction_removed` on a message → `reaction` (Slack's emoji name,
  `white_check_mark` …): ✅/❌ on an approval prompt decides it;
- `message` with subtype `message_changed` → `edited`; `message_deleted` → `recalled`;
- a `block_actions` interaction (at the interactivity Request URL, or an `interactive`
  envelope in Socket Mode: a press on the approve/deny buttons `approval_blocks` puts
  on an approval prompt) → `action`.

A reaction names only the channel and the message, not its thread: in a channel whose
session scope is `thread`, the thread is asked for (`with_thread`, `conversations.replies`).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

import structlog

from app.errors import DeliveryError, InvalidPayload
from app.events import ChatType, InboundEvent, NativeEvent, NativeKind, SessionScope, native_of
from channels.slack.outbound import SlackOutbound

log = structlog.get_logger(__name__)

CHANNEL = "slack"


def _chat_type(channel: str, channel_type: Any = None) -> ChatType:
    direct = channel_type == "im" or (channel_type is None and channel.startswith("D"))
    return ChatType.DIRECT if direct else ChatType.GROUP


def _reply_meta(user: str, team: Any) -> dict[str, Any]:
    # `reply_*` keys are copied onto replies: a private notice goes to this user.
    return {"reply_slack_user": user, "reply_slack_team": team}


def parse_native(
    payload: dict[str, Any], event: dict[str, Any], scope: SessionScope, bot_user_id: str | None
) -> InboundEvent | None:
    """The native event of an Events API event; None when it is none of ours."""
    kind, event_id, team = event.get("type"), str(payload.get("event_id")), payload.get("team_id")
    if kind in ("reaction_added", "reaction_removed"):
        raw = event.get("item")
        item: dict[str, Any] = raw if isinstance(raw, dict) else {}
        user, channel, ts = event.get("user"), item.get("channel"), item.get("ts")
        if item.get("type") != "message" or not isinstance(user, str) or user == bot_user_id:
            return None
        if not isinstance(channel, str) or not isinstance(ts, str):
            return None
        native = NativeEvent(
            kind=NativeKind.REACTION,
            target=ts,
            emoji=str(event.get("reaction") or ""),
            removed=kind == "reaction_removed",
        )
        return InboundEvent.native(
            native,
            channel=CHANNEL,
            chat_id=channel,
            sender_id=user,
            chat_type=_chat_type(channel),
            external_id=f"event:{event_id}",
            session_scope=scope,
            metadata=_reply_meta(user, team),
        )
    subtype, channel = event.get("subtype"), event.get("channel")
    if (
        kind != "message"
        or subtype not in ("message_changed", "message_deleted")
        or not isinstance(channel, str)
    ):
        return None
    changed = event.get("message") if subtype == "message_changed" else event.get("previous_message")
    changed = changed if isinstance(changed, dict) else {}
    user, ts = changed.get("user"), changed.get("ts") or event.get("deleted_ts")
    if not isinstance(user, str) or not isinstance(ts, str) or user == bot_user_id or changed.get("bot_id"):
        return None
    thread = changed.get("thread_ts")
    is_edit = subtype == "message_changed"
    return InboundEvent.native(
        NativeEvent(kind=NativeKind.EDITED if is_edit else NativeKind.RECALLED, target=ts),
        channel=CHANNEL,
        chat_id=channel,
        sender_id=user,
        text=str(changed.get("text") or "") if is_edit else "",
        thread_id=thread if isinstance(thread, str) and thread else None,
        chat_type=_chat_type(channel, event.get("channel_type")),
        external_id=f"event:{event_id}",
        session_scope=scope,
        metadata=_reply_meta(user, team),
    )


def parse_block_action(payload: dict[str, Any], scope: SessionScope) -> list[InboundEvent]:
    """The `action` events of a `block_actions` interaction (one per action pressed)."""
    user = (payload.get("user") or {}).get("id")
    channel = (payload.get("channel") or {}).get("id") or (payload.get("container") or {}).get("channel_id")
    container = payload.get("container") or {}
    message = payload.get("message") or {}
    ts = container.get("message_ts") or message.get("ts")
    thread = message.get("thread_ts")
    if not isinstance(user, str) or not isinstance(channel, str):
        return []
    events = []
    for action in payload.get("actions") or ():
        if not isinstance(action, dict):
            continue
        name, value = str(action.get("action_id") or ""), action.get("value")
        events.append(
            InboundEvent.native(
                NativeEvent(kind=NativeKind.ACTION, target=ts, action=name, value=value),
                channel=CHANNEL,
                chat_id=channel,
                sender_id=user,
                thread_id=thread if isinstance(thread, str) and thread else None,
                chat_type=_chat_type(channel),
                external_id=f"action:{payload.get('trigger_id') or ts}:{action.get('action_ts') or name}",
                session_scope=scope,
                metadata=_reply_meta(user, (payload.get("team") or {}).get("id")),
            )
        )
    return events


def interaction_payload(body: bytes) -> Any:
    """The payload of an interactivity request (`payload=<JSON>`, form-encoded); Socket
    Mode's `interactive` envelopes carry the same payload as JSON."""
    try:
        fields = urllib.parse.parse_qs(body.decode())
        return json.loads(fields["payload"][0])
    except (KeyError, IndexError, ValueError, UnicodeDecodeError) as exc:
        raise InvalidPayload("an interaction needs a form field payload with a JSON object") from exc


def approval_blocks(text: str, approval_id: Any, locale: str) -> list[dict[str, Any]]:
    """The prompt's text with approve / deny buttons (`block_actions` come back)."""
    approve, deny = ("批准", "拒绝") if locale == "zh" else ("Approve", "Deny")
    return [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}},
        {
            "type": "actions",
            "elements": [
                {
                    "type": "button",
                    "action_id": "approve",
                    "style": "primary",
                    "text": {"type": "plain_text", "text": approve},
                    "value": str(approval_id),
                },
                {
                    "type": "button",
                    "action_id": "deny",
                    "style": "danger",
                    "text": {"type": "plain_text", "text": deny},
                    "value": str(approval_id),
                },
            ],
        },
    ]


def needs_thread(event: InboundEvent) -> bool:
    """A reaction in a channel whose sessions are threads: the event names no thread."""
    native = native_of(event)
    return (
        native is not None
        and native.kind is NativeKind.REACTION
        and event.chat_type is ChatType.GROUP
        and event.session_scope is SessionScope.THREAD
        and event.thread_id is None
    )


async def with_thread(outbound: SlackOutbound, event: InboundEvent) -> InboundEvent:
    """`event` in the thread of the message it reacts to (`conversations.replies`, which
    needs the `channels:history` / `groups:history` scope); as it was when that fails."""
    native = native_of(event)
    target = native.target if native is not None else None
    try:
        resp = await outbound.call("conversations_replies", channel=event.chat_id, ts=target, limit=1)
    except DeliveryError as exc:
        log.info("slack_reaction_thread_unknown", detail=exc.detail)
        return event
    messages = resp.get("messages") or []
    first = messages[0] if messages and isinstance(messages[0], dict) else {}
    thread = first.get("thread_ts")
    return event.model_copy(update={"thread_id": str(thread)}) if thread else event
