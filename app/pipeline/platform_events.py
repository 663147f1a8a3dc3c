"""Platform-native events: edits, recalls, reactions, joins and button presses (docs/events.md).

Each arrives like a message — accepted into the inbox (durable, deduplicated on its
`external_id`), handled on its session in order with the messages — and is handled here
as one registry entry no one can type (`NATIVE_EVENTS`): never merged into a turn or
steered. What it does is the channel's policy:

- **edited**: a message still queued is answered as edited (`before_turn` applies the edit
  when the message's turn starts; the edit itself then finds nothing left to do); an
  answered one is, by `<CHANNEL>_EDIT_POLICY`, annotated (the model gets a note on the next
  turn) or answered again (`rerun`: the old exchange is marked superseded, as `/retry` does);
- **recalled**: a message still queued is not answered (`before_turn`); an answered one's
  exchange is marked hidden (`recalled`, append-only, the model no longer sees it) and our
  replies to it are deleted where the adapter can (`deletes_messages`);
- **reaction**: ✅/❌ on an approval prompt is `/approve`/`/deny` by the reacting member;
  any other reaction becomes a note the model reads;
- **action** (a button): `approve`/`deny` with an approval's id is `/approve`/`/deny`;
  others become a note;
- **joined/left**: `<CHANNEL>_WELCOME_TEXT` / `<CHANNEL>_FAREWELL_TEXT`, off when empty.

A decision by button or reaction runs the `/approve` or `/deny` command itself, so who may
decide is checked in one place (`app.pipeline.approvals`); a refusal is a private notice.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import structlog

from app.channel import ChannelSettings
from app.db.models import utcnow
from app.events import (
    APPROVAL_KEY,
    DELETE_KEY,
    MESSAGE_REF_KEY,
    NATIVE_KEY,
    InboundEvent,
    NativeEvent,
    NativeKind,
    OutboundMessage,
    TextPart,
    native_of,
)
from app.pipeline.commands import NATIVE_EVENTS, Command, CommandCall, CommandRegistry
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import Answer, InboxRow, PipelineStore
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import Handled
from app.sessions.history_marks import hidden_ranges, is_hidden, mark
from app.sessions.history_notes import add_note
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)

# Reactions that decide an approval prompt (emoji, and Slack's names for them).
APPROVING = frozenset({"✅", "✔️", "✔", "👍", "white_check_mark", "heavy_check_mark", "+1", "thumbsup"})
DENYING = frozenset({"❌", "✖️", "👎", "x", "-1", "thumbsdown", "no_entry", "negative_squared_cross_mark"})
LOOKAHEAD = 100  # queued rows searched for edits and recalls of a turn's messages
SNIPPET = 200  # characters of a message quoted in a note


def _snippet(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SNIPPET else text[:SNIPPET] + "…"


def _who(event: InboundEvent) -> str:
    return str(event.metadata.get("sender_name") or event.metadata.get("sender_username") or event.sender_id)


def _by_author(event: InboundEvent, native: NativeEvent, original: InboundEvent) -> bool:
    """Whether `event` (an edit or recall) comes from the author of `original`."""
    return not native.author_known or event.sender_id == original.sender_id


class PlatformEvents:
    def __init__(
        self,
        store: PipelineStore,
        replies: Replies,
        turns: TurnRunner,
        registry: CommandRegistry,
        channel_settings: Mapping[str, ChannelSettings],
    ) -> None:
        self.store = store
        self.replies = replies
        self.turns = turns  # an edit's rerun is a turn
        self.registry = registry  # a button press or reaction runs /approve or /deny
        self.channel_settings = channel_settings

    def commands(self) -> list[Command]:
        help_text = {"en": "(platform events: edits, recalls, reactions, buttons)", "zh": "（平台事件）"}
        return [Command(NATIVE_EVENTS, help_text, self.handle)]

    def _settings(self, channel: str) -> ChannelSettings | None:
        return self.channel_settings.get(channel)

    # --- before a turn: queued edits and recalls of its messages ---------------------

    async def before_turn(self, lease: SessionLease, rows: list[InboxRow]) -> list[InboxRow]:
        """The turn's `rows` with the edits queued after them applied (the message is
        answered as edited) and without those recalled meanwhile (done, not answered)."""
        refs = {
            str(r.event.metadata[MESSAGE_REF_KEY]): r for r in rows if MESSAGE_REF_KEY in r.event.metadata
        }
        if not refs:
            return rows
        edits: dict[str, InboundEvent] = {}
        recalled: set[str] = set()
        for queued in await self.store.next_rows(lease.key, LOOKAHEAD):
            native = native_of(queued.event)
            if native is None or native.target not in refs:
                continue
            original = refs[native.target].event
            if queued.channel != original.channel or not _by_author(queued.event, native, original):
                continue  # only its author edits or recalls a message
            if native.kind is NativeKind.EDITED and queued.event.text:
                edits[native.target] = queued.event
            elif native.kind is NativeKind.RECALLED:
                recalled.add(native.target)
        kept: list[InboxRow] = []
        for row in rows:
            ref = str(row.event.metadata.get(MESSAGE_REF_KEY, ""))
            if ref in recalled:
                await self.store.answer(lease, Answer([row.id]))
                self.replies.handled([row.event_id], outbox=False)
                log.info("recalled_before_answer", event_id=row.event_id)
            elif ref in edits:
                others = tuple(p for p in row.event.parts if not isinstance(p, TextPart))
                parts = (TextPart(text=edits[ref].text), *others)
                kept.append(replace(row, event=row.event.model_copy(update={"parts": parts})))
                log.info("edited_before_answer", event_id=row.event_id)
            else:
                kept.append(row)
        return kept

    # --- the event's own turn -----------------------------------------------------

    async def handle(self, call: CommandCall) -> Handled | None:
        native = native_of(call.event)
        if native is None:  # the registry sends only native events here
            await self.replies.answer(call.lease, call.row, None)
            return None
        log.info("platform_event", kind=native.kind.value, channel=call.event.channel)
        if native.kind is NativeKind.EDITED:
            return await self._edited(call, native)
        if native.kind is NativeKind.RECALLED:
            await self._recalled(call, native)
        elif native.kind is NativeKind.REACTION:
            return await self._reaction(call, native)
        elif native.kind is NativeKind.ACTION:
            return await self._action(call, native)
        else:
            await self._membership(call, native)
        return None

    async def _message_of(
        self, call: CommandCall, native: NativeEvent
    ) -> tuple[Any, ChatMessage, int] | None:
        """The current session, the user message `native` is about, and its exchange's last seq."""
        if native.target is None:
            return None
        found = (await self.store.inbox_by_ref(call.lease.key, [native.target])).get(native.target)
        if found is None or not _by_author(call.event, native, found.event):
            return None
        opened = await self.store.open_session(call.lease, conversation_channel(call.event))
        session = opened.session
        history = await self.store.sessions.all_messages(session.id)
        hidden = hidden_ranges(opened.metadata)  # as stored now (a tool may have written it)
        for index, message in enumerate(history):
            if (
                message.event_id == found.event_id
                and message.role == "user"
                and not is_hidden(message.seq, hidden)
            ):
                later = (m for m in history[index + 1 :] if m.role == "user" and m.event_id != found.event_id)
                after = next(later, None)
                end = (after.seq or 0) - 1 if after is not None else (history[-1].seq or 0)
                return session, message, end
        return None

    async def _done(self, call: CommandCall, text: str | None = None) -> None:
        await self.replies.answer(call.lease, call.row, text)

    async def _edited(self, call: CommandCall, native: NativeEvent) -> Handled | None:
        found = await self._message_of(call, native)
        new = call.event.text
        if found is None or not new or (found[1].content or "") == new:
            await self._done(call)  # unknown, or already answered as edited (`before_turn`)
            return None
        session, message, end = found
        settings = self._settings(call.event.channel)
        policy = settings.edit_policy if settings is not None else "annotate"
        by, at = call.event.sender_id, utcnow()
        channel = conversation_channel(call.event)
        if policy == "rerun":

            def superseded(metadata: dict[str, Any]) -> dict[str, Any]:
                return mark(metadata, message.seq or 0, end, why="superseded", by=by, at=at)

            await self.store.set_session_metadata(call.lease, channel, superseded)
            metadata = {k: v for k, v in call.event.metadata.items() if k != NATIVE_KEY}
            again = call.event.model_copy(update={"parts": (TextPart(text=new),), "metadata": metadata})
            return await self.turns.run(call.lease, [replace(call.row, event=again)], None)
        note = (
            f'{_who(call.event)} edited an earlier message: "{_snippet(message.content or "")}" '
            f'now reads "{_snippet(new)}"'
        )

        def annotated(metadata: dict[str, Any]) -> dict[str, Any]:
            return add_note(metadata, note, before=session.next_seq, at=at)

        answer = self.replies.answer_of(call.row, None)
        await self.store.set_session_metadata(call.lease, channel, annotated, answer=answer)
        self.replies.handled([call.row.event_id], outbox=False)
        return None

    async def _recalled(self, call: CommandCall, native: NativeEvent) -> None:
        found = await self._message_of(call, native)
        if found is None:
            await self._done(call)  # unknown, or recalled before it was answered (`before_turn`)
            return
        session, message, end = found
        by, at = call.event.sender_id, utcnow()
        note = f"{_who(call.event)} recalled an earlier message; its content is withdrawn."

        def retracted(metadata: dict[str, Any]) -> dict[str, Any]:
            marked = mark(metadata, message.seq or 0, end, why="recalled", by=by, at=at)
            return add_note(marked, note, before=session.next_seq, at=at)

        deletions = await self._deletions(message.event_id or "", call.event.channel)
        rows = [
            self.replies.row(d, session_id=session.id, run_id=None, event_id=call.row.event_id)
            for d in deletions
        ]
        answer = Answer([call.row.id], rows)
        await self.store.set_session_metadata(
            call.lease, conversation_channel(call.event), retracted, answer=answer
        )
        self.replies.handled([call.row.event_id], outbox=bool(rows))

    async def _deletions(self, event_id: str, channel: str) -> list[OutboundMessage]:
        """Deletions of our replies to `event_id`, where the channel's adapter can delete."""
        settings = self._settings(channel)
        if not event_id or settings is None or not getattr(settings, "deletes_messages", False):
            return []
        return [
            OutboundMessage(
                channel=sent.message.channel,
                chat_id=sent.message.chat_id,
                thread_id=sent.message.thread_id,
                session_key=sent.message.session_key,
                metadata={**sent.message.metadata, DELETE_KEY: sent.platform_message_id},
            )
            for sent in await self.store.sent_replies(event_id)
        ]

    async def _reaction(self, call: CommandCall, native: NativeEvent) -> Handled | None:
        emoji, target = native.emoji or "", native.target or ""
        ours = await self.store.reply_by_platform_id(call.lease.key, target) if target else None
        if ours is not None and not native.removed and APPROVAL_KEY in ours.metadata:
            if emoji in APPROVING or emoji in DENYING:
                command = "/approve" if emoji in APPROVING else "/deny"
                return await self._decide(call, command, str(ours.metadata[APPROVAL_KEY]))
        if ours is not None:
            about = f'your answer "{_snippet(ours.text)}"'
        else:
            found = await self.store.inbox_by_ref(call.lease.key, [target]) if target else {}
            if target not in found:  # a message the bot never saw: no context for it
                await self._done(call)
                return None
            about = f'the message "{_snippet(found[target].event.text)}"'
        verb = "took back the reaction" if native.removed else "reacted with"
        await self._note(call, f"{_who(call.event)} {verb} {emoji} to {about}.")
        return None

    async def _action(self, call: CommandCall, native: NativeEvent) -> Handled | None:
        if native.action in ("approve", "deny") and (native.value or "").isdigit():
            return await self._decide(call, f"/{native.action}", native.value or "")
        label = native.value or native.action or "?"
        await self._note(call, f'{_who(call.event)} pressed the button "{_snippet(label)}".')
        return None

    async def _decide(self, call: CommandCall, command: str, approval_id: str) -> Handled | None:
        """Run `/approve <id>` or `/deny <id>` as the member who pressed or reacted."""
        event = call.event.model_copy(update={"parts": (TextPart(text=f"{command} {approval_id}"),)})
        found = self.registry.find(event.model_copy(update={"metadata": {}}))
        if found is None:
            await self._done(call)
            return None
        entry, args = found
        decision = CommandCall(call.lease, replace(call.row, event=event), entry.name, args, call.locale)
        return await entry.run(decision)

    async def _note(self, call: CommandCall, text: str) -> None:
        session = (await self.store.open_session(call.lease, conversation_channel(call.event))).session
        at = utcnow()

        def noted(metadata: dict[str, Any]) -> dict[str, Any]:
            return add_note(metadata, text, before=session.next_seq, at=at)

        answer = self.replies.answer_of(call.row, None)
        await self.store.set_session_metadata(
            call.lease, conversation_channel(call.event), noted, answer=answer
        )
        self.replies.handled([call.row.event_id], outbox=False)

    async def _membership(self, call: CommandCall, native: NativeEvent) -> None:
        settings = self._settings(call.event.channel)
        template = ""
        if settings is not None:
            template = settings.welcome_text if native.kind is NativeKind.JOINED else settings.farewell_text
        name = native.name or _who(call.event)
        await self._done(call, template.replace("{name}", name) if template else None)
