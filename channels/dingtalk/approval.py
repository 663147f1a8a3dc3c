"""DingTalk approval buttons (docs/events.md): an interactive card out, a card callback in.

With `DINGTALK_APPROVAL_CARD_TEMPLATE_ID` (a card template made in DingTalk's card
platform, see docs/events.md) and Stream mode, an approval prompt (`APPROVAL_KEY`) is sent
as a card of that template (`createAndDeliver`, `callbackType: STREAM`) with the prompt in
its `content` variable and the approval's number in `approval_id`. The template's two
buttons are "回传请求" (request) actions: a press reaches the Stream connection as a
CALLBACK frame on topic `/v1.0/card/instances/callback` whose data names the card
(`outTrackId`), the member who pressed (`userId`) and what was pressed
(`content.cardPrivateData`: `actionIds` and `params`).

The callback names neither the chat nor the prompt's session, so the card's `outTrackId`
carries them (`prompt_track_id`): the approval's number, the prompt's session key, the chat
and its type. Only this app creates its cards and the callback comes over the app's own
authenticated connection, so the values are as trusted as the callback itself.

A press becomes an `action` event by the member who pressed. A refusal (a member who may
not approve) is sent to that member alone, as a one-to-one robot message (`PRESS_KEY`).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from dingtalk_stream import CallbackHandler

from app.errors import InvalidPayload
from app.events import APPROVAL_KEY, ChatType, InboundEvent, NativeEvent, NativeKind, OutboundMessage
from channels.dingtalk.parse import CHANNEL, GROUP, SINGLE, Parsed
from channels.dingtalk.settings import DingTalkSettings

CARD_CALLBACK_TOPIC: str = CallbackHandler.TOPIC_CARD_CALLBACK  # "/v1.0/card/instances/callback"
# The presser's user id on the replies to a press: a refusal goes to them alone.
PRESS_KEY = "reply_dingtalk_card_press"
CONTENT_KEY, APPROVAL_ID_KEY = "content", "approval_id"  # the template's variables
_TRACK_PREFIX = "cga1."
ACTIONS = ("approve", "deny")


@dataclass(frozen=True)
class Prompt:
    """What an approval card's `outTrackId` says about the prompt it shows."""

    approval_id: str
    session_key: str | None
    chat_id: str
    conversation_type: str  # "1" single, "2" group


def prompt_track_id(message: OutboundMessage, conversation_type: str) -> str:
    """The card's `outTrackId`: the prompt it shows, and a digest of the outbox message (one
    card per prompt: a retried delivery names the same card)."""
    fields = [str(message.metadata[APPROVAL_KEY]), message.session_key, message.chat_id, conversation_type]
    packed = base64.urlsafe_b64encode(json.dumps(fields, separators=(",", ":")).encode()).decode()
    digest = hashlib.sha256(message.message_id.encode()).hexdigest()[:12]
    return f"{_TRACK_PREFIX}{packed.rstrip('=')}.{digest}"


def read_track_id(track_id: str) -> Prompt | None:
    """The prompt an `outTrackId` of ours names; None for any other card."""
    if not track_id.startswith(_TRACK_PREFIX):
        return None
    packed, _, _digest = track_id[len(_TRACK_PREFIX) :].partition(".")
    try:
        fields = json.loads(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4)))
    except ValueError:
        return None
    if not isinstance(fields, list) or len(fields) != 4:
        return None
    approval_id, session, chat_id, kind = fields
    if not str(approval_id).isdigit() or not isinstance(chat_id, str) or not chat_id:
        return None
    if kind not in (SINGLE, GROUP) or not (session is None or isinstance(session, str)):
        return None
    return Prompt(str(approval_id), session or None, chat_id, kind)


def card_params(message: OutboundMessage, text: str) -> dict[str, str]:
    return {CONTENT_KEY: text, APPROVAL_ID_KEY: str(message.metadata[APPROVAL_KEY])}


def approval_label(approval_id: Any, locale: str) -> str:
    return f"审批 #{approval_id}" if locale == "zh" else f"Approval #{approval_id}"


def _pressed(content: Any) -> str | None:
    """`approve` or `deny` from a callback's `content` (`cardPrivateData`), or None."""
    if isinstance(content, str):
        try:
            content = json.loads(content)
        except ValueError:
            return None
    private = content.get("cardPrivateData") if isinstance(content, dict) else None
    if not isinstance(private, dict):
        return None
    params = private.get("params")
    action = params.get("action") if isinstance(params, dict) else None
    if action in ACTIONS:
        return str(action)
    ids = private.get("actionIds")
    return next((str(a) for a in ids if a in ACTIONS), None) if isinstance(ids, list) else None


def parse_card_callback(payload: Any, settings: DingTalkSettings) -> Parsed:
    """A card callback → an `action` event by the member who pressed; `InvalidPayload` when
    it is not a callback; ignored when it is not a press on one of our approval cards."""
    if not isinstance(payload, dict):
        raise InvalidPayload("a card callback must be a JSON object")
    track_id, user_id = payload.get("outTrackId"), payload.get("userId")
    if not isinstance(track_id, str) or not track_id or not isinstance(user_id, str) or not user_id:
        raise InvalidPayload("a card callback needs outTrackId and userId")
    prompt = read_track_id(track_id)
    if prompt is None:
        return Parsed(ignored="a card that is not an approval prompt of ours")
    action = _pressed(payload.get("content"))
    if action is None:
        return Parsed(ignored="not a press on approve or deny")
    # The same member pressing the same button again (or DingTalk redelivering the
    # callback) is the same event: stored once.
    dedup = hashlib.sha256(f"{track_id}\n{user_id}\n{action}".encode()).hexdigest()[:40]
    group = prompt.conversation_type == GROUP
    return Parsed(
        event=InboundEvent.native(
            NativeEvent(kind=NativeKind.ACTION, target=track_id, action=action, value=prompt.approval_id),
            channel=CHANNEL,
            chat_id=prompt.chat_id,
            sender_id=user_id,
            session_key_override=prompt.session_key,
            chat_type=ChatType.GROUP if group else ChatType.DIRECT,
            external_id=f"card:{dedup}",
            session_scope=settings.session_scope,
            metadata={"reply_conversation_type": prompt.conversation_type, PRESS_KEY: user_id},
        )
    )
