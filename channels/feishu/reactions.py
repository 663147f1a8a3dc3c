"""Feishu reactions as `reaction` events (docs/events.md).

`im.message.reaction.created_v1` / `deleted_v1` name the message, the emoji and who reacted
(`user_id.open_id`), but not the message's chat, thread or the chat's type, which an event
needs to reach its session. They are found:

- for an approval card the bot sent, in the record kept when it was sent (kind
  `approval_card`: the prompt's session, chat, chat type and the prompt's message id as the
  outbox knows it), so ✅/❌ there reaches the prompt's session as the card's buttons do;
- for any other message, by asking Feishu (`GET /open-apis/im/v1/messages/{id}`: its chat
  and reply chain, computed into a thread as a message's is; `GET /open-apis/im/v1/chats/{id}`
  for the chat's type, remembered per chat).

Feishu's emoji types that decide an approval are given as the emoji the pipeline reads
(`CheckMark`/`DONE` ✅, `THUMBSUP` 👍, `CrossMark` ❌, `THUMBSDOWN` 👎); others keep
Feishu's name (`FIRE`, `SMILE` …). Reactions by apps (bots) are not events.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import structlog

from app.channel import RecordStore
from app.errors import ChannelRejected, DeliveryError, InvalidPayload
from app.events import ChatType, InboundEvent, NativeEvent, NativeKind
from channels.feishu.api import FeishuApi
from channels.feishu.parse import CHANNEL
from channels.feishu.settings import FeishuSettings

log = structlog.get_logger(__name__)

REACTION_CREATED = "im.message.reaction.created_v1"
REACTION_DELETED = "im.message.reaction.deleted_v1"
CARD_RECORD = "approval_card"  # channel record: an approval card we sent, by its message id
LOOKUP_SECONDS = 1.2  # each Open API lookup, inside Feishu's ~3 s wait for our answer
MAX_CHAT_TYPES = 1000  # chats whose type is remembered

EMOJI = {
    "CheckMark": "✅",
    "DONE": "✅",
    "THUMBSUP": "👍",
    "CrossMark": "❌",
    "THUMBSDOWN": "👎",
}


@dataclass(frozen=True)
class Reaction:
    event_id: str
    message_id: str
    emoji: str
    removed: bool
    open_id: str


@dataclass(frozen=True)
class Where:
    """Where a message is, as far as sessions go."""

    chat_id: str
    chat_type: ChatType
    thread_id: str | None = None
    session_key: str | None = None  # the session it belongs to, when known exactly
    target: str | None = None  # the message id the pipeline knows it by, when another


class LookupFailed(Exception):
    """Feishu could not say where the message is now; it may later (the event is retried)."""


def parse_reaction(payload: dict[str, Any]) -> Reaction | None:
    """A verified reaction event; None when an app (a bot) reacted."""
    header, body = payload.get("header"), payload.get("event")
    if not isinstance(header, dict) or not isinstance(body, dict):
        raise InvalidPayload("a schema 2.0 event needs a header and an event object")
    event_id, message_id = header.get("event_id"), body.get("message_id")
    kind = body.get("reaction_type")
    emoji = kind.get("emoji_type") if isinstance(kind, dict) else None
    if not all(isinstance(v, str) and v for v in (event_id, message_id, emoji)):
        raise InvalidPayload(
            "a reaction event needs header.event_id, message_id and reaction_type.emoji_type"
        )
    if body.get("operator_type", "user") != "user":
        return None
    ids = body.get("user_id")
    open_id = ids.get("open_id") if isinstance(ids, dict) else None
    if not isinstance(open_id, str) or not open_id:
        raise InvalidPayload("a reaction by a user needs user_id.open_id")
    return Reaction(
        event_id=str(event_id),
        message_id=str(message_id),
        emoji=EMOJI.get(str(emoji), str(emoji)),
        removed=header.get("event_type") == REACTION_DELETED,
        open_id=open_id,
    )


def reaction_event(reaction: Reaction, where: Where, settings: FeishuSettings) -> InboundEvent:
    return InboundEvent.native(
        NativeEvent(
            kind=NativeKind.REACTION,
            target=where.target or reaction.message_id,
            emoji=reaction.emoji,
            removed=reaction.removed,
        ),
        channel=CHANNEL,
        chat_id=where.chat_id,
        sender_id=reaction.open_id,
        thread_id=where.thread_id,
        chat_type=where.chat_type,
        session_key_override=where.session_key,
        external_id=reaction.event_id,
        session_scope=settings.session_scope,
        metadata={"feishu_event_id": reaction.event_id},
    )


class MessageLocator:
    """Where a reacted-to message is (see the module's docstring)."""

    def __init__(self, api: FeishuApi, settings: FeishuSettings, records: RecordStore | None) -> None:
        self.api = api
        self.settings = settings
        self.records = records
        self._chat_types: dict[str, ChatType] = {}

    async def remember_card(
        self, card_id: str, *, session_key: str | None, chat_id: str, chat_type: str, target: str | None
    ) -> None:
        """Keep where an approval card went (best-effort: without it, Feishu is asked)."""
        if self.records is None or not session_key:
            return
        data = {"session": session_key, "chat_id": chat_id, "chat_type": chat_type, "target": target}
        try:
            await self.records.put(CARD_RECORD, card_id, data, open=False)
        except Exception:  # the card is sent; a reaction on it then asks Feishu
            log.exception("feishu_card_record_failed", message_id=card_id)

    async def locate(self, message_id: str) -> Where | None:
        """None: Feishu does not know the message (recalled, another tenant's …)."""
        card = await self.records.get(CARD_RECORD, message_id) if self.records is not None else None
        if card is not None and isinstance(card.data.get("session"), str):
            data = card.data
            return Where(
                chat_id=str(data["chat_id"]),
                chat_type=ChatType.DIRECT if data.get("chat_type") == "p2p" else ChatType.GROUP,
                session_key=str(data["session"]),
                target=str(data["target"]) if data.get("target") else None,
            )
        try:
            answer = await self.api.get(
                f"/open-apis/im/v1/messages/{quote(message_id)}", timeout=LOOKUP_SECONDS
            )
        except ChannelRejected as exc:
            log.info("feishu_reacted_message_unknown", message_id=message_id, detail=exc.detail)
            return None
        except DeliveryError as exc:
            raise LookupFailed(exc.detail) from exc
        items = (answer.get("data") or {}).get("items")
        item = items[0] if isinstance(items, list) and items and isinstance(items[0], dict) else {}
        chat_id = item.get("chat_id")
        if not isinstance(chat_id, str) or not chat_id:
            return None
        chat_type = await self._chat_type(chat_id)
        # As a message's thread (`parse_message_event`): its reply chain's root, or the
        # message itself where every group message opens a thread.
        root = item.get("root_id") if isinstance(item.get("root_id"), str) else None
        sender = item.get("sender")
        opens = (
            chat_type is ChatType.GROUP
            and self.settings.reply_in_thread
            and isinstance(sender, dict)
            and sender.get("sender_type") == "user"
        )
        return Where(chat_id=chat_id, chat_type=chat_type, thread_id=root or (message_id if opens else None))

    async def _chat_type(self, chat_id: str) -> ChatType:
        known = self._chat_types.get(chat_id)
        if known is not None:
            return known
        try:
            answer = await self.api.get(
                f"/open-apis/im/v1/chats/{quote(chat_id, safe='')}", timeout=LOOKUP_SECONDS
            )
        except DeliveryError as exc:  # a group, the stricter guess (not remembered)
            log.info("feishu_chat_type_unknown", chat_id=chat_id, detail=exc.detail)
            return ChatType.GROUP
        mode = (answer.get("data") or {}).get("chat_mode")
        chat_type = ChatType.DIRECT if mode == "p2p" else ChatType.GROUP
        if len(self._chat_types) >= MAX_CHAT_TYPES:
            self._chat_types.clear()
        self._chat_types[chat_id] = chat_type
        return chat_type
