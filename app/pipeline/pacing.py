"""Outbound pacing: replies and previews sent within each platform's published limits.

Every send to a platform passes token buckets first: one for the bot (the channel), one
for the chat, and one for the group when the target is a group. A bucket spaces its
sends by `seconds / count` (no bursts), so at most `count` fall in any `seconds`; the
buckets live in the database (`pacing_buckets`, through the storage port), so every
replica draws from the same ones. A platform's `retry_after` (Telegram's flood control,
Slack's and Discord's 429) pauses the target's chat and group buckets for every replica.

Final answers (the outbox sender) take the first slot their buckets allow; one that is
more than `max_wait` away is handed back to the outbox for then, so a chat over its
budget never holds up the replies of other chats. Previews (streaming edits) are best
effort and come second: they go only when the buckets are idle and no final answer is
waiting, so when a chat is over budget its previews stop first and its answers go on.
Edits of a native streaming card (`card=True`) are not chat messages: where the channel has
a `card` limit they take its one bucket per bot instead of the chat's (still as previews:
never waiting, skipped when not idle), so a card's stream does not eat the chat's budget
and does not have to wait for it.

A chat (and its group) has one final answer in flight at a time, across replicas: the
next waits for the platform's answer to it (`sent`), so a `retry_after` is known before
the next send leaves, even when a round trip takes longer than the chat's interval.

Limits are per channel and scope, with the platforms' published numbers as defaults
(`app.pacing_limits`, docs/operations.md "Pacing") and `PACING_LIMITS` overriding them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import structlog

from app.events import OutboundMessage
from app.pacing_limits import Rate
from app.pipeline.storage.port import PipelineStore
from app.pipeline.storage.records import PaceBucket, PaceGrant, PaceTake

log = structlog.get_logger(__name__)

LATE_SECONDS = 0.02  # a send leaving later than its slot by more holds the next one back
LEAVING_WRITES = 3  # at most so many holds written for one late send


def _telegram_group(message: OutboundMessage) -> bool:
    # Groups, supergroups and channels have negative ids (private chats are users' ids).
    return message.chat_id.startswith("-")


# How a channel's group chats are recognised where the chat id says it.
GROUP_RULES: Mapping[str, Callable[[OutboundMessage], bool]] = {"telegram": _telegram_group}


def is_group(message: OutboundMessage) -> bool:
    rule = GROUP_RULES.get(message.channel)
    if rule is not None:
        return rule(message)
    return message.metadata.get("chat_type") == "group"


class Pacer:
    """The buckets of a message, and asking them (through the storage port) before a send.

    `clock` is wall-clock unix seconds: replicas compare slots taken on other machines.
    """

    def __init__(
        self,
        store: PipelineStore,
        limits: Mapping[str, Mapping[str, Rate]],
        *,
        max_wait: float = 1.0,
        hold: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.limits = {channel: dict(rates) for channel, rates in limits.items() if rates}
        self.max_wait = max_wait
        self.hold = hold  # the longest a send in flight holds its chat (a sender may die)
        self.clock = clock

    def buckets(self, message: OutboundMessage) -> tuple[PaceBucket, ...]:
        rates = self.limits.get(message.channel)
        if not rates:
            return ()
        found = []
        chat = f"{message.channel}:chat:{message.chat_id}"
        group = f"{message.channel}:group:{message.chat_id}"
        if (rate := rates.get("bot")) is not None:
            found.append(PaceBucket(f"{message.channel}:bot", rate.interval))
        if (rate := rates.get("chat")) is not None:
            found.append(PaceBucket(chat, rate.interval, exclusive=True))
        if (rate := rates.get("group")) is not None and is_group(message):
            found.append(PaceBucket(group, rate.interval, exclusive=True))
        return tuple(found)

    def _card_bucket(self, message: OutboundMessage, card: bool) -> tuple[PaceBucket, ...] | None:
        """The bucket of a card edit, or None when it is paced as a chat message."""
        rate = self.limits.get(message.channel, {}).get("card") if card else None
        return None if rate is None else (PaceBucket(f"{message.channel}:card", rate.interval),)

    def _chat_buckets(self, message: OutboundMessage) -> list[str]:
        """The buckets of the message's chat (and group), not the bot-wide one."""
        return [b.name for b in self.buckets(message) if b.exclusive]

    async def final(self, message: OutboundMessage) -> PaceGrant:
        """A final answer's slot: granted (send at `at`), or come back at `at`."""
        buckets = self.buckets(message)
        now = self.clock()
        if not buckets:
            return PaceGrant(True, now)
        return await self.store.take_pace(PaceTake(buckets, now=now, within=self.max_wait, hold=self.hold))

    async def sent(self, message: OutboundMessage, grant: PaceGrant) -> None:
        """The platform answered the send of `grant` (whatever it said, after a
        `retry_after` was recorded): the next send to the chat may go."""
        if grant.held_until:
            await self.store.release_pace(self._chat_buckets(message), grant.held_until)

    async def preview(self, message: OutboundMessage, *, card: bool = False) -> bool:
        """Whether a preview (a streaming edit; `card`: a card update) may go now; it never waits."""
        buckets = self._card_bucket(message, card) or self.buckets(message)
        if not buckets:
            return True
        grant = await self.store.take_pace(PaceTake(buckets, now=self.clock(), within=0.0, preview=True))
        return grant.granted

    async def paused_until(self, message: OutboundMessage) -> float:
        """Until when the message's buckets are paused (0 when they are not): a
        `retry_after`, or a send of theirs that left late (`leaving`)."""
        names = [b.name for b in self.buckets(message)]
        return await self.store.pace_paused(names) if names else 0.0

    async def leaving(self, message: OutboundMessage, slot: float) -> None:
        """The send in `slot` leaves now. When it leaves late (a busy event loop, a slow
        database), the next send of its buckets, whose slot was counted from this one's,
        is held until a whole interval after now: the platform counts arrivals."""
        now = self.clock()
        if now - slot <= LATE_SECONDS:
            return
        by_interval: dict[float, list[str]] = {}
        for bucket in self.buckets(message):
            by_interval.setdefault(bucket.interval, []).append(bucket.name)
        # The send leaves after these writes: when they took long themselves (a cold
        # connection, a busy database), the hold is counted again from their end.
        for _ in range(LEAVING_WRITES):
            for interval, names in by_interval.items():
                await self.store.pause_pace(names, now + interval + LATE_SECONDS)
            written = self.clock()
            if written - now <= LATE_SECONDS:
                return
            now = written

    async def rate_limited(
        self, message: OutboundMessage, retry_after: float, *, card: bool = False
    ) -> float:
        """The platform said wait: pause the chat's buckets (a card update's 429: the card
        bucket, where the channel has one) for every replica; until when."""
        until = self.clock() + max(retry_after, 0.0)
        # A channel without limits has no buckets: the row's own retry waits `retry_after`.
        card_bucket = self._card_bucket(message, card)
        if card_bucket is not None:
            names = [b.name for b in card_bucket]
        else:
            names = self._chat_buckets(message) or [b.name for b in self.buckets(message)]
        if names:
            await self.store.pause_pace(names, until)
        log.info("pacing_paused", channel=message.channel, retry_after=retry_after)
        return until

    def wait(self, at: float) -> float:
        """Seconds from now until `at`."""
        return max(0.0, at - self.clock())
