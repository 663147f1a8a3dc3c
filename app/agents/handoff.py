"""`/handoff CHANNEL` and `/handoff back`: one conversation across platforms.

`/handoff CHANNEL` in a session moves it to the sender's linked identity on CHANNEL
(`/link`, `app.agents.links`): that identity's direct chat with the bot (known from its
latest direct message there) is redirected to the session's key (table `handoffs`), so
what it sends next continues the same session, with the same history, and the answers go
there. `/handoff back` (from either side) removes the session's redirects.

Authorization stays with the channel and the linked identity: the channel's own checks
run on every event before this, and a redirect applies only to events from the identity
it names while that identity is still linked (`/unlink` ends it). A session key alone
grants nothing.

Every inbound direct-chat event is checked for a redirect, and almost none has one, so
each replica keeps the set of redirected chats in memory: read once, read again after
any change. A change is published on the session bus under `CHANGED` (PostgreSQL
LISTEN/NOTIFY across replicas), and a bus reconnect (`resync`) clears the set too. A
replica that has not subscribed yet (or whose follower stopped) asks the database
every time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import structlog
from sqlalchemy import bindparam, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.bus import SessionBus
from app.db.direct import Direct, connect
from app.db.engine import autocommit
from app.db.models import handoffs, inbox, utcnow
from app.events import ChatType, InboundEvent
from app.memory.identity import IdentityLinks, identity_of, split_identity
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say

log = structlog.get_logger(__name__)

REDIRECT = Direct(
    select(handoffs.c.to_key, handoffs.c.identity).where(handoffs.c.from_key == bindparam("from_key"))
)

REDIRECTED = Direct(select(handoffs.c.from_key))
CHANGED = "%handoffs"  # bus key of handoff changes: no session key lacks a ':'

Assign = Callable[[InboundEvent], Awaitable[InboundEvent]]
SCAN = 200  # newest inbox rows of the channel searched for the identity's direct chat


class Handoffs:
    def __init__(self, store: PipelineStore, replies: Replies, engine: AsyncEngine, bus: SessionBus) -> None:
        self.store = store
        self.replies = replies
        self.engine = engine
        self.bus = bus
        self.links = IdentityLinks(engine)
        self._redirected: frozenset[str] | None = None  # from_keys with a redirect; None: read
        self._changes = 0  # counts invalidations: a read that raced one is not kept
        self._following = False
        self._follower: asyncio.Task[None] | None = None

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
        self._redirected = None

    async def _changed(self) -> None:
        self._forget()
        await self.bus.publish(CHANGED, {"type": "handoffs"})

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

    async def _reply(self, call: CommandCall, text: str) -> None:
        async with self.store.fenced(call.lease) as conn:
            await self.replies.answer(conn, call.row, text, session_id=None)
        self.replies.handled([call.row.event_id])

    async def handoff(self, call: CommandCall) -> None:
        target = call.args.strip()
        if not target:
            await self._reply(call, say("handoff.usage", call.locale))
            return
        if target.lower() == "back":
            async with self.engine.begin() as conn:
                gone = await conn.execute(delete(handoffs).where(handoffs.c.to_key == call.lease.key))
            await self._changed()
            key = "handoff.back" if gone.rowcount else "handoff.none"
            await self._reply(call, say(key, call.locale))
            return
        event = call.event
        if target == event.channel:
            await self._reply(call, say("handoff.here", call.locale, channel=target))
            return
        other = await self._linked_on(identity_of(event.channel, event.sender_id), target)
        if other is None:
            await self._reply(call, say("handoff.not_linked", call.locale, channel=target))
            return
        chat = await self._direct_chat(target, split_identity(other)[1])
        if chat is None:
            await self._reply(call, say("handoff.say_hi", call.locale, channel=target))
            return
        async with self.engine.begin() as conn:
            await conn.execute(delete(handoffs).where(handoffs.c.from_key == chat))
            await conn.execute(
                insert(handoffs).values(
                    from_key=chat, to_key=call.lease.key, identity=other, created_at=utcnow()
                )
            )
        await self._changed()
        log.info("handoff", to_key=call.lease.key, channel=target)
        await self._reply(call, say("handoff.done", call.locale, channel=target))

    async def _linked_on(self, me: str, channel: str) -> str | None:
        """The identity on `channel` linked to the same person as `me`."""
        mine = await self.links.links(identity=me)
        if not mine:
            return None
        for link in await self.links.links(mine[0].person_id):
            if link.channel == channel and link.identity != me:
                return link.identity
        return None

    async def _direct_chat(self, channel: str, sender_id: str) -> str | None:
        """The own key of `sender_id`'s direct chat on `channel`, from its latest message."""
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
                    return event.model_copy(update={"session_key_override": None}).session_key
        return None

    async def redirect(self, event: InboundEvent) -> InboundEvent:
        """Ingest: an event of a handed-off direct chat joins the session it continues.

        Every inbound event passes here: only direct chats are handed off, and only those
        in the set of redirected chats are looked up."""
        if event.session_key_override or event.source_session_key or event.chat_type is not ChatType.DIRECT:
            return event
        if self._following and event.session_key not in await self._redirected_keys():
            return event
        async with connect(autocommit(self.engine)) as conn:
            row = await REDIRECT.first(conn, {"from_key": event.session_key})
        if row is None or row["identity"] != identity_of(event.channel, event.sender_id):
            return event
        if not await self.links.links(identity=row["identity"]):  # unlinked since: no longer
            return event
        return event.model_copy(update={"session_key_override": row["to_key"]})

    async def _redirected_keys(self) -> frozenset[str]:
        if self._redirected is not None:
            return self._redirected
        seen = self._changes
        async with connect(autocommit(self.engine)) as conn:
            keys = frozenset(row["from_key"] for row in await REDIRECTED.rows(conn, {}))
        if seen == self._changes:  # no change arrived while reading
            self._redirected = keys
        return keys


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
