"""Matrix room events as platform-native events (docs/events.md).

- a person's edit (`m.room.message` with `m.relates_to.rel_type: m.replace`, the new text
  in `m.new_content`) → `edited`, about the original event;
- `m.room.redaction` of a person's message → `recalled` (its author is the message's
  sender, whoever redacted it: a moderator may redact a member's message);
- `m.reaction` (`m.annotation` with a `key`) → `reaction` (✅/❌/👍/👎 on an approval
  prompt decide it);
- `m.room.member` in a group room: a member who now is joined and was not → `joined`, a
  joined member who left or was banned → `left`; read only when `MATRIX_WELCOME_TEXT` or
  `MATRIX_FAREWELL_TEXT` is set (otherwise they would be stored to do nothing).

The bot's own events (its streamed `m.replace` edits, its redactions, its membership) are
never events. An edit or reaction names its target event but not the target's thread, so
the target is read from the homeserver (`GET /rooms/{room}/event/{id}`) for its thread; a
redacted message has lost its relations, so its thread is the one this replica saw it in
(remembered for the newest `THREADS_KEPT` messages), else the room's main timeline. The
inbox's external id is the event's own id, so a sync given again stores nothing twice.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import structlog

from app.events import MESSAGE_REF_KEY, ChatType, InboundEvent, NativeEvent, NativeKind
from channels.matrix.api import MatrixError, q

if TYPE_CHECKING:
    from channels.matrix.adapter import MatrixChannel

log = structlog.get_logger(__name__)

THREADS_KEPT = 10000
NATIVE_TYPES = frozenset({"m.room.redaction", "m.reaction", "m.room.member"})
# Element's quick reactions carry a variation selector (👍️): read as the plain emoji.
_PLAIN = frozenset({"👍", "👎", "✅", "❌", "✔", "✖"})


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def is_edit(raw: dict[str, Any]) -> bool:
    relates = _dict(_dict(raw.get("content")).get("m.relates_to"))
    return raw.get("type") == "m.room.message" and relates.get("rel_type") == "m.replace"


def reaction_key(key: str) -> str:
    plain = key.replace("\ufe0f", "")
    return plain if plain in _PLAIN else key


def thread_of(content: dict[str, Any]) -> str | None:
    relates = _dict(content.get("m.relates_to"))
    return _str(relates.get("event_id")) or None if relates.get("rel_type") == "m.thread" else None


def after_own_join(timeline: list[Any], bot: str) -> int:
    """The index after the bot's own (last) join in `timeline`, 0 without one: membership
    changes before it happened before the bot was there (a new room's history)."""
    start = 0
    for index, raw in enumerate(timeline):
        if (
            isinstance(raw, dict)
            and raw.get("type") == "m.room.member"
            and raw.get("state_key") == bot
            and _dict(raw.get("content")).get("membership") == "join"
        ):
            start = index + 1
    return start


class MatrixNative:
    def __init__(self, channel: MatrixChannel) -> None:
        self.channel = channel
        self._threads: OrderedDict[str, str] = OrderedDict()  # message event id → thread root

    def remember(self, event: InboundEvent) -> None:
        """The thread of a message received, for a redaction of it later."""
        ref = event.metadata.get(MESSAGE_REF_KEY)
        if event.thread_id and isinstance(ref, str):
            self._threads[ref] = event.thread_id
            while len(self._threads) > THREADS_KEPT:
                self._threads.popitem(last=False)

    async def receive(self, raw: dict[str, Any], room_id: str, *, members_known: bool) -> None:
        """Accept `raw` as a native event if it is one; `members_known`: a membership change
        happened while the bot was in the room (not before its own join)."""
        bot = self.channel.user_id
        sender = _str(raw.get("sender"))
        event_id = _str(raw.get("event_id"))
        if not sender or not event_id or sender == bot:
            return
        kind = raw.get("type")
        if kind == "m.room.member":
            event = await self._member(raw, room_id, event_id) if members_known else None
        elif kind == "m.room.redaction":
            event = await self._redaction(raw, room_id, event_id, sender)
        elif kind == "m.reaction":
            event = await self._reaction(raw, room_id, event_id, sender)
        elif is_edit(raw):
            event = await self._edit(raw, room_id, event_id, sender)
        else:
            event = None
        if event is not None:
            results = await self.channel.context.accept([event])
            self.channel.duplicates += sum(1 for r in results if r.duplicate)

    async def _target(self, room_id: str, event_id: str) -> dict[str, Any] | None:
        """The event `event_id` as the homeserver has it now; None when it cannot say (a
        network failure propagates: the sync is handled again)."""
        if not event_id:
            return None
        try:
            return await self.channel.client.call("GET", f"/rooms/{q(room_id)}/event/{q(event_id)}")
        except MatrixError as exc:
            log.info("matrix_event_target_unknown", room=room_id, target=event_id, error=str(exc))
            return None

    async def _event(
        self,
        native: NativeEvent,
        room_id: str,
        event_id: str,
        sender: str,
        *,
        thread: str | None,
        reply_to: str | None,
        text: str = "",
    ) -> InboundEvent:
        direct = await self.channel.direct(room_id)
        metadata: dict[str, Any] = {}
        if reply_to:
            metadata["reply_event_id"] = reply_to
            if not direct:
                metadata["reply_in_group"] = True
        return InboundEvent.native(
            native,
            channel=self.channel.name,
            chat_id=room_id,
            sender_id=sender,
            text=text,
            thread_id=thread,
            chat_type=ChatType.DIRECT if direct else ChatType.GROUP,
            external_id=f"event:{event_id}",
            session_scope=self.channel.settings.session_scope,
            metadata=metadata,
        )

    async def _edit(
        self, raw: dict[str, Any], room_id: str, event_id: str, sender: str
    ) -> InboundEvent | None:
        content = _dict(raw.get("content"))
        target = _str(_dict(content.get("m.relates_to")).get("event_id"))
        new = _dict(content.get("m.new_content"))
        text = _str(new.get("body"))
        if not target or not text:
            return None
        if new.get("msgtype") == "m.emote":
            text = f"* {text}"
        original = await self._target(room_id, target)
        thread = thread_of(_dict(original.get("content"))) if original else None
        native = NativeEvent(kind=NativeKind.EDITED, target=target)
        return await self._event(native, room_id, event_id, sender, thread=thread, reply_to=target, text=text)

    async def _redaction(
        self, raw: dict[str, Any], room_id: str, event_id: str, sender: str
    ) -> InboundEvent | None:
        # Room versions up to 10 carry `redacts` at the top, 11 in the content.
        target = _str(_dict(raw.get("content")).get("redacts")) or _str(raw.get("redacts"))
        original = await self._target(room_id, target)
        if original is not None:
            if original.get("type") != "m.room.message":
                return None  # a reaction taken back, a state event: not a recalled message
            author = _str(original.get("sender")) or sender
        else:
            author = sender
        if not target or author == self.channel.user_id:
            return None
        native = NativeEvent(kind=NativeKind.RECALLED, target=target)
        thread = self._threads.get(target)
        return await self._event(native, room_id, event_id, author, thread=thread, reply_to=None)

    async def _reaction(
        self, raw: dict[str, Any], room_id: str, event_id: str, sender: str
    ) -> InboundEvent | None:
        relates = _dict(_dict(raw.get("content")).get("m.relates_to"))
        target, key = _str(relates.get("event_id")), _str(relates.get("key"))
        if relates.get("rel_type") != "m.annotation" or not target or not key:
            return None
        original = await self._target(room_id, target)
        thread = thread_of(_dict(original.get("content"))) if original else None
        native = NativeEvent(kind=NativeKind.REACTION, target=target, emoji=reaction_key(key))
        return await self._event(native, room_id, event_id, sender, thread=thread, reply_to=target)

    async def _member(self, raw: dict[str, Any], room_id: str, event_id: str) -> InboundEvent | None:
        settings = self.channel.settings
        member = _str(raw.get("state_key"))
        if not member or member == self.channel.user_id:
            return None
        content = _dict(raw.get("content"))
        before = _dict(_dict(raw.get("unsigned")).get("prev_content"))
        now, was = content.get("membership"), before.get("membership")
        if now == "join" and was != "join":
            kind, name, wanted = NativeKind.JOINED, _str(content.get("displayname")), settings.welcome_text
        elif now in ("leave", "ban") and was == "join":
            kind, name, wanted = NativeKind.LEFT, _str(before.get("displayname")), settings.farewell_text
        else:
            return None  # an invitation, a new display name, a knock …
        if not wanted:
            return None  # nothing would be said: not stored at all
        try:
            count = await self.channel.client.joined_members(room_id)
        except MatrixError as exc:
            log.warning("matrix_members_unknown", room=room_id, error=str(exc))
            return None
        # A group: three or more members with the bot (after a join), two or more left (after a leave).
        if count < (3 if kind is NativeKind.JOINED else 2):
            return None
        native = NativeEvent(kind=kind, name=name or member)
        return InboundEvent.native(
            native,
            channel=self.channel.name,
            chat_id=room_id,
            sender_id=member,
            chat_type=ChatType.GROUP,
            external_id=f"event:{event_id}",
            session_scope=settings.session_scope,
        )


__all__ = ["NATIVE_TYPES", "MatrixNative", "after_own_join", "is_edit", "reaction_key"]
