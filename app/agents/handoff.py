"""`/handoff CHANNEL` and `/handoff back`: one conversation across platforms.

`/handoff CHANNEL` in a session moves it to the sender's linked identity on CHANNEL
(`/link`, `app.agents.links`): that identity's direct chat with the bot (known from its
latest direct message there) is redirected to the session's key (table `handoffs`), so
what it sends next continues the same session, with the same history, and the answers go
there. `/handoff back` (from either side) removes the session's redirects.

Both ends are told: `/handoff CHANNEL` answers in the chat it was sent from and sends a
notice to the target chat; `/handoff back` answers where it was sent and sends a notice
to the other end (the original chat, the target chat, or both when sent from a third).
Messages the handing-off identity still sends in the original direct chat join the
session as before (that chat's key is the session's), and their answers go to the target
chat, where the conversation now is (`reply_target`); commands sent there (`/handoff
back`) are answered there, and anyone else keeps their own chat.

Authorization stays with the channel and the linked identity: the channel's own checks
run on every event before this, and a redirect applies only to events from the identity
it names while that identity is still linked (`/unlink` ends it). A session key alone
grants nothing.

Every inbound direct-chat event is checked for a redirect, and almost none has one, so
each replica keeps the set of handed-off chats (both ends) in memory: read once, read
again after any change. A change is published on the session bus under `CHANGED`
(PostgreSQL LISTEN/NOTIFY across replicas), and a bus reconnect (`resync`) clears the set
too. A replica that has not subscribed yet (or whose follower stopped) asks the database
every time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog
from sqlalchemy import bindparam, delete, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.bus import SessionBus
from app.db.direct import Direct, connect
from app.db.engine import autocommit
from app.db.models import handoffs, inbox, utcnow
from app.events import ChatType, InboundEvent, OutboundMessage, TextPart
from app.memory.identity import IdentityLinks, identity_of, split_identity
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies
from app.pipeline.texts import say

log = structlog.get_logger(__name__)

REDIRECT = Direct(
    select(
        handoffs.c.from_key, handoffs.c.to_key, handoffs.c.identity, handoffs.c.origin, handoffs.c.target
    ).where(or_(handoffs.c.from_key == bindparam("key"), handoffs.c.to_key == bindparam("key")))
)

HANDED_OFF = Direct(select(handoffs.c.from_key, handoffs.c.to_key))
CHANGED = "%handoffs"  # bus key of handoff changes: no session key lacks a ':'

Assign = Callable[[InboundEvent], Awaitable[InboundEvent]]
SCAN = 200  # newest inbox rows of the channel searched for the identity's direct chat


class Handoffs:
    def __init__(
        self,
        replies: Replies,
        engine: AsyncEngine,
        bus: SessionBus,
        *,
        locale_of: Callable[[str], str] | None = None,
    ) -> None:
        self.replies = replies
        self.engine = engine
        self.bus = bus
        self.links = IdentityLinks(engine)
        self._handed_off: frozenset[str] | None = None  # keys at either end; None: read
        self._changes = 0  # counts invalidations: a read that raced one is not kept
        self._following = False
        self._follower: asyncio.Task[None] | None = None
        self.locale_of = locale_of or (lambda channel: "en")  # a channel's <CHANNEL>_LOCALE

    async def start(self) -> None:
        self._follower = asyncio.create_task(self._follow(), name="handoff-follower")

    async def stop(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None

    async def _follow(self) -> None:
        while True:
            try:
                async with self.bus.subscribe(CHANGED) as queue:
                    self._forget()  # whatever was read before the subscription may be stale
                    self._following = True
                    while True:
                        await queue.get()  # a change, an overflow or a resync: read again
                        self._forget()
            except Exception:  # the bus could not LISTEN: ask the database meanwhile
                log.warning("handoff_follower_failed", exc_info=True)
            finally:
                self._following = False
                self._forget()
            await asyncio.sleep(1.0)

    def _forget(self) -> None:
        self._changes += 1
        self._handed_off = None

    async def _changed(self) -> None:
        self._forget()
        await self.bus.publish(CHANGED, {"type": "handoffs"})

    async def _handed_off_keys(self) -> frozenset[str]:
        if self._handed_off is not None:
            return self._handed_off
        seen = self._changes
        async with connect(autocommit(self.engine)) as conn:
            rows = await HANDED_OFF.rows(conn, {})
        keys = frozenset(k for row in rows for k in (row["from_key"], row["to_key"]))
        if seen == self._changes:  # no change arrived while reading
            self._handed_off = keys
        return keys

    def commands(self) -> list[Command]:
        return [
            Command(
                "/handoff",
                {
                    "en": "Continue this conversation on your linked account on another platform.",
                    "zh": "在你关联的其他平台账号上继续当前对话。",
                },
                self.handoff,
                usage="<CHANNEL>|back",
            )
        ]

    async def _reply(
        self, call: CommandCall, text: str, notices: list[OutboundMessage] | None = None
    ) -> None:
        """Answer the command, and send `notices` to other chats, in one fenced transaction."""
        await self.replies.answer(call.lease, call.row, text, notices=notices or ())

    def _notice(self, to: Mapping[str, Any], key: str, text_key: str, channel: str) -> OutboundMessage:
        return OutboundMessage(
            channel=str(to["channel"]),
            chat_id=str(to["chat_id"]),
            thread_id=to.get("thread_id"),
            parts=(TextPart(text=say(text_key, self.locale_of(str(to["channel"])), channel=channel)),),
            session_key=key,
        )

    async def handoff(self, call: CommandCall) -> None:
        target = call.args.strip()
        if not target:
            await self._reply(call, say("handoff.usage", call.locale))
            return
        if target.lower() == "back":
            await self._back(call)
            return
        event = call.event
        if target == event.channel:
            await self._reply(call, say("handoff.here", call.locale, channel=target))
            return
        me = identity_of(event.channel, event.sender_id)
        other = await self._linked_on(me, target)
        if other is None:
            await self._reply(call, say("handoff.not_linked", call.locale, channel=target))
            return
        chat = await self._direct_chat(target, split_identity(other)[1])
        if chat is None:
            await self._reply(call, say("handoff.say_hi", call.locale, channel=target))
            return
        origin = {
            "channel": event.channel,
            "chat_id": event.chat_id,
            "thread_id": event.thread_id,
            "identity": me,
        }
        there = {"channel": chat.channel, "chat_id": chat.chat_id}
        from_key = chat.model_copy(update={"session_key_override": None}).session_key
        async with self.engine.begin() as conn:
            await conn.execute(delete(handoffs).where(handoffs.c.from_key == from_key))
            await conn.execute(
                insert(handoffs).values(
                    from_key=from_key,
                    to_key=call.lease.key,
                    identity=other,
                    created_at=utcnow(),
                    origin=origin,
                    target=there,
                )
            )
        await self._changed()
        log.info("handoff", to_key=call.lease.key, channel=target)
        arrived = self._notice(there, call.lease.key, "handoff.arrived", event.channel)
        await self._reply(call, say("handoff.done", call.locale, channel=target), [arrived])

    async def _back(self, call: CommandCall) -> None:
        """Remove the session's redirects; tell the ends that did not send the command."""
        key, event = call.lease.key, call.event
        async with self.engine.begin() as conn:
            gone = (
                await conn.execute(
                    select(handoffs.c.origin, handoffs.c.target).where(handoffs.c.to_key == key)
                )
            ).all()
            await conn.execute(delete(handoffs).where(handoffs.c.to_key == key))
        await self._changed()
        if not gone:
            await self._reply(call, say("handoff.none", call.locale))
            return

        def elsewhere(chat: Mapping[str, Any] | None) -> bool:
            return bool(chat) and (chat["channel"], chat["chat_id"]) != (event.channel, event.chat_id)  # type: ignore[index]

        notices: list[OutboundMessage] = []
        for origin, there in gone:
            if origin and elsewhere(origin):
                notices.append(self._notice(origin, key, "handoff.back_here", event.channel))
            if there and elsewhere(there):
                back_to = origin["channel"] if origin else event.channel
                notices.append(self._notice(there, key, "handoff.back_away", back_to))
        await self._reply(call, say("handoff.back", call.locale), notices)

    async def _linked_on(self, me: str, channel: str) -> str | None:
        """The identity on `channel` linked to the same person as `me`."""
        mine = await self.links.links(identity=me)
        if not mine:
            return None
        for link in await self.links.links(mine[0].person_id):
            if link.channel == channel and link.identity != me:
                return link.identity
        return None

    async def _direct_chat(self, channel: str, sender_id: str) -> InboundEvent | None:
        """The latest direct message of `sender_id` on `channel` (its chat is the target)."""
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(inbox.c.payload)
                .where(inbox.c.channel == channel)
                .order_by(inbox.c.id.desc())
                .limit(SCAN)
            )
            for (payload,) in rows:
                event = InboundEvent.model_validate(payload)
                if event.sender_id == sender_id and event.chat_type is ChatType.DIRECT:
                    return event
        return None

    async def redirect(self, event: InboundEvent) -> InboundEvent:
        """Ingest: an event of a handed-off direct chat joins the session it continues, and
        one of the original direct chat from the identity that handed it off is answered
        in the target chat.

        Every inbound event passes here: only direct chats are handed off, and only those
        in the set of handed-off chats are looked up."""
        if event.session_key_override or event.source_session_key or event.chat_type is not ChatType.DIRECT:
            return event
        key = event.session_key
        if self._following and key not in await self._handed_off_keys():
            return event
        async with connect(autocommit(self.engine)) as conn:
            rows = await REDIRECT.rows(conn, {"key": key})
        if not rows:
            return event
        me = identity_of(event.channel, event.sender_id)
        for row in rows:
            if row["from_key"] == key and row["identity"] == me:
                if not await self.links.links(identity=me):  # unlinked since: no longer
                    return event
                return event.model_copy(update={"session_key_override": row["to_key"]})
        if (event.text or "").lstrip().startswith("/"):  # a command is answered where it was sent
            return event
        for row in rows:
            origin, there = row["origin"], row["target"]
            if row["to_key"] == key and origin and there and origin.get("identity") == me:
                target = {"channel": there["channel"], "chat_id": there["chat_id"], "thread_id": None}
                return event.model_copy(update={"metadata": {**event.metadata, "reply_target": target}})
        return event


def chained(*steps: Assign | None) -> Assign | None:
    """Ingest's `assign`: the given steps in order (None: none)."""
    present = [s for s in steps if s is not None]
    if not present:
        return None

    async def run(event: InboundEvent) -> InboundEvent:
        for step in present:
            event = await step(event)
        return event

    return run
