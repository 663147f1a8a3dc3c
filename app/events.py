"""The event model: what every channel turns platform payloads into.

An `InboundEvent` always lands on exactly one session key, computed here from the
channel's session scope (or an explicit override), so no other module has to know how
keys are built.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ChatType(StrEnum):
    DIRECT = "direct"
    GROUP = "group"


class SessionScope(StrEnum):
    CHAT = "chat"
    THREAD = "thread"
    USER_IN_CHAT = "user_in_chat"


class BusyPolicy(StrEnum):
    QUEUE = "queue"
    COLLECT = "collect"
    STEER = "steer"


class _Part(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class TextPart(_Part):
    type: Literal["text"] = "text"
    text: str


class ImagePart(_Part):
    type: Literal["image"] = "image"
    url: str | None = None
    data_base64: str | None = None
    mime_type: str | None = None
    # Where the file is in the session's workspace (relative to it), for the file tools.
    workspace_path: str | None = None


class FilePart(_Part):
    type: Literal["file"] = "file"
    url: str | None = None
    data_base64: str | None = None
    name: str | None = None
    mime_type: str | None = None
    size: int | None = None
    workspace_path: str | None = None  # as on `ImagePart`


class MentionPart(_Part):
    type: Literal["mention"] = "mention"
    user_id: str
    is_self: bool = False


class ReplyToPart(_Part):
    type: Literal["reply_to"] = "reply_to"
    message_id: str


Part = Annotated[TextPart | ImagePart | FilePart | MentionPart | ReplyToPart, Field(discriminator="type")]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _new_id() -> str:
    return uuid.uuid4().hex


def escape_key_component(value: str) -> str:
    """Escape one session-key component so that joined keys never collide.

    `%` is escaped first, then the `:` separator; the mapping is injective, so two
    different component tuples always give two different keys.
    """
    return value.replace("%", "%25").replace(":", "%3A")


def build_session_key(
    channel: str,
    chat_id: str,
    scope: SessionScope = SessionScope.CHAT,
    *,
    thread_id: str | None = None,
    sender_id: str | None = None,
) -> str:
    parts = [escape_key_component(channel), escape_key_component(chat_id)]
    if scope is SessionScope.THREAD and thread_id:
        parts.append(escape_key_component(thread_id))
    elif scope is SessionScope.USER_IN_CHAT:
        if sender_id is None:
            raise ValueError("user_in_chat scope needs a sender_id")
        parts += ["user", escape_key_component(sender_id)]
    return ":".join(parts)


# The event metadata key where an adapter puts the sender's role in a group chat as the
# platform reported it: owner, admin, member or guest (`app.access.roles`).
ROLE_KEY = "role"

DEFAULT_AGENT = "default"
AGENT_MARK = "%agent="  # the key component naming a non-default agent (`InboundEvent`)


def agent_in_key(key: str) -> str | None:
    """The agent a session key names (None: the default agent)."""
    for component in key.split(":"):
        if component.startswith(AGENT_MARK):
            return component[len(AGENT_MARK) :].replace("%3A", ":").replace("%25", "%")
    return None


# The event metadata key where an adapter puts the platform's own id of a message (Telegram
# `message_id`, Slack `ts`, OneBot `message_id`), so a later edit, recall or reaction of it
# can find the event it belongs to (`app.pipeline.platform_events`).
MESSAGE_REF_KEY = "message_ref"
# The outbound metadata key of an approval prompt's id: adapters with buttons add
# approve/deny buttons to it (their press comes back as `/approve <id>` or `/deny <id>`).
APPROVAL_KEY = "approval_id"
# The outbound metadata key of a notice meant only for the sender of the event it answers
# (a refused button press): adapters show it privately where the platform can (Telegram's
# answerCallbackQuery alert, Slack's ephemeral message) instead of posting it in the chat.
PRIVATE_NOTICE_KEY = "private_notice"
# The outbound metadata key of a deletion: the adapter deletes its own message with this
# platform id instead of sending anything (adapters whose settings say `deletes_messages`).
DELETE_KEY = "delete_message_id"
# The event metadata key of a platform-native event (`NativeEvent`, docs/events.md).
NATIVE_KEY = "native"


class NativeKind(StrEnum):
    EDITED = "edited"  # the message `target` now reads as the event's text
    RECALLED = "recalled"  # the message `target` was recalled (deleted) by its sender
    REACTION = "reaction"  # `emoji` added to (or, `removed`, taken off) the message `target`
    JOINED = "joined"  # the sender joined the chat
    LEFT = "left"  # the sender left the chat (or was removed)
    ACTION = "action"  # a button or card action: `action` (and `value`) on the message `target`


class NativeEvent(BaseModel):
    """What a platform-native event says, beyond who and where (`InboundEvent.metadata["native"]`).

    It travels through the same inbox as messages (durable, deduplicated on the event's
    `external_id`, in order with the session's messages); the pipeline's policies decide
    what it does (`app.pipeline.platform_events`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: NativeKind
    target: str | None = None  # the platform's id of the message it is about (MESSAGE_REF_KEY)
    emoji: str | None = None
    removed: bool = False
    action: str | None = None
    value: str | None = None
    name: str | None = None  # the member's display name (joined/left)
    # False: the platform does not say who wrote the recalled message (Feishu's recall
    # event), so it is not checked against the event's sender.
    author_known: bool = True


def native_of(event: InboundEvent) -> NativeEvent | None:
    """The platform-native event `event` carries, or None for a message."""
    raw = event.metadata.get(NATIVE_KEY)
    if not isinstance(raw, dict):
        return None
    try:
        return NativeEvent.model_validate(raw)
    except ValueError:
        return None


MAX_EXTERNAL_ID_CHARS = 256  # inbox.external_id
MAX_SESSION_KEY_CHARS = 512  # inbox.session_key, session_keys.key

# Text that no store can hold: NUL (PostgreSQL text and jsonb refuse it) and lone UTF-16
# surrogates (no UTF-8 encoding exists, so every append of such an event would fail).
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
# Identifiers become session-key components and log fields: no control characters either.
_BAD_ID = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")
_ID_FIELDS = (
    "chat_id",
    "sender_id",
    "thread_id",
    "external_id",
    "session_key_override",
    "source_session_key",
)


def unstorable_text(value: str) -> bool:
    """Whether `value` holds a NUL or a lone surrogate, which chatgate refuses at the door."""
    return _UNSTORABLE.search(value) is not None


def unstorable_in(value: Any) -> bool:
    """`unstorable_text` over nested JSON-like data, without recursion (any depth)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if _UNSTORABLE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


class InboundEvent(BaseModel):
    """One thing that happened on a channel and must be handled by one session."""

    model_config = ConfigDict(frozen=True)

    event_id: str = Field(default_factory=_new_id)
    channel: str
    chat_id: str
    sender_id: str
    thread_id: str | None = None
    chat_type: ChatType = ChatType.DIRECT
    parts: tuple[Part, ...] = ()
    external_id: str | None = None
    session_scope: SessionScope = SessionScope.CHAT
    session_key_override: str | None = None
    source_session_key: str | None = None
    received_at: datetime = Field(default_factory=_utcnow)
    metadata: dict[str, Any] = Field(default_factory=dict)
    # A non-default agent (app.agents) serving this conversation: part of the key.
    agent: str | None = None

    @model_validator(mode="after")
    def _storable(self) -> InboundEvent:
        """Refuse, at the door, what could be acknowledged but never stored (issue 16)."""
        # Every event passes here (and again when read back): one search over all the ids
        # joined (joining adds no character); naming the one at fault only when one is.
        ids = (self.chat_id, self.sender_id, self.thread_id, self.external_id)
        keys = (self.session_key_override, self.source_session_key)
        if _BAD_ID.search("".join(filter(None, (*ids, *keys)))):
            for name in _ID_FIELDS:
                value = getattr(self, name)
                if value is not None and _BAD_ID.search(value):
                    raise ValueError(f"{name} contains a control character, NUL or lone surrogate")
        # The inbox's columns: a longer id or key would be refused by PostgreSQL only after
        # the platform was as good as answered (SQLite does not check lengths at all).
        if self.external_id is not None and len(self.external_id) > MAX_EXTERNAL_ID_CHARS:
            raise ValueError(f"the platform's message id is longer than {MAX_EXTERNAL_ID_CHARS} characters")
        if len(self.session_key) > MAX_SESSION_KEY_CHARS:
            raise ValueError(f"the session key would be longer than {MAX_SESSION_KEY_CHARS} characters")
        # Parts are flat models of strings and numbers: their strings as they are.
        for part in self.parts:
            for value in vars(part).values():
                if isinstance(value, str) and _UNSTORABLE.search(value):
                    raise ValueError(
                        "text contains a NUL character or a lone surrogate (\\u0000, \\ud800-\\udfff)"
                    )
        if self.metadata and unstorable_in(self.metadata):
            raise ValueError("metadata contains a NUL character or a lone surrogate")
        return self

    @property
    def session_key(self) -> str:
        if self.session_key_override:
            return self.session_key_override
        if self.source_session_key:
            return self.source_session_key
        key = build_session_key(
            self.channel,
            self.chat_id,
            self.session_scope,
            thread_id=self.thread_id,
            sender_id=self.sender_id,
        )
        if not self.agent:
            return key
        # After the channel; `%agent=` is no escaped component's start (`%` is always `%25`).
        channel, rest = key.split(":", 1)
        return f"{channel}:{AGENT_MARK}{escape_key_component(self.agent)}:{rest}"

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))

    @classmethod
    def native(
        cls,
        native: NativeEvent,
        *,
        channel: str,
        chat_id: str,
        sender_id: str,
        text: str = "",
        metadata: dict[str, Any] | None = None,
        **kw: Any,
    ) -> InboundEvent:
        """A platform-native event (`NativeEvent`); `text` is an edit's new text."""
        parts = (TextPart(text=text),) if text else ()
        meta = {**(metadata or {}), NATIVE_KEY: native.model_dump(mode="json", exclude_defaults=True)}
        return cls(channel=channel, chat_id=chat_id, sender_id=sender_id, parts=parts, metadata=meta, **kw)

    @classmethod
    def from_text(cls, channel: str, chat_id: str, sender_id: str, text: str, **kw: Any) -> InboundEvent:
        return cls(channel=channel, chat_id=chat_id, sender_id=sender_id, parts=(TextPart(text=text),), **kw)


class OutboundMessage(BaseModel):
    """A reply to deliver; `message_id` is stable across retries, for delivery dedup."""

    model_config = ConfigDict(frozen=True)

    message_id: str = Field(default_factory=_new_id)
    channel: str
    chat_id: str
    thread_id: str | None = None
    parts: tuple[Part, ...] = ()
    reply_to: str | None = None
    session_key: str | None = None
    in_reply_to_event: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(p.text for p in self.parts if isinstance(p, TextPart))


def stored_json(message: InboundEvent | OutboundMessage) -> dict[str, Any]:
    """What the inbox or the outbox stores of an event or a reply: its JSON without the
    fields that are None (each one's default, so reading it back gives the same object).

    Those are a quarter of a text event's bytes, in every row version the table keeps
    (`bench/RESULTS.md`, "Bytes per event").
    """
    return message.model_dump(mode="json", exclude_none=True)
