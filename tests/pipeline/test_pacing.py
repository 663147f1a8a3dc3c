"""Pacing limits (`PACING_LIMITS` over the platforms' defaults) and the `Pacer` on every store."""

from __future__ import annotations

from typing import Any, cast

import pytest
from pydantic import ValidationError

from app.config import Settings
from app.events import OutboundMessage, TextPart
from app.pacing_limits import DEFAULT_LIMITS, Rate, limits_with, parse_limits
from app.pipeline.pacing import Pacer
from app.pipeline.storage.port import PipelineStore


def _message(channel: str, chat: str) -> OutboundMessage:
    return OutboundMessage(channel=channel, chat_id=chat, parts=(TextPart(text="hi"),))


def test_overrides_replace_add_and_drop_limits() -> None:
    limits = limits_with("telegram.group=10/60, slack.chat=2/1,discord.bot=off,line.chat=100/1")
    assert limits["telegram"] == {"bot": Rate(30, 1), "chat": Rate(1, 1), "group": Rate(10, 60)}
    assert limits["slack"]["chat"] == Rate(2, 1)
    assert limits["discord"] == {"chat": Rate(5, 5)}
    assert limits["line"] == {"chat": Rate(100, 1)}
    assert DEFAULT_LIMITS["discord"]["bot"] == Rate(50, 1)  # the defaults are untouched
    assert Rate(20, 60).interval == 3.0


@pytest.mark.parametrize(
    "bad", ["telegram=1/1", "telegram.room=1/1", "telegram.chat=0/1", "telegram.chat=1/0", "telegram.chat=x"]
)
def test_a_malformed_override_fails_at_start_up(bad: str) -> None:
    with pytest.raises(ValueError, match="PACING_LIMITS"):
        parse_limits(bad)
    with pytest.raises(ValidationError, match="PACING_LIMITS"):
        Settings(_env_file=None, pacing_limits=bad)  # type: ignore[call-arg]


async def test_a_telegram_group_has_a_group_bucket_and_a_private_chat_not(store: PipelineStore) -> None:
    pacer = Pacer(store, limits_with(""))
    group = [b.name for b in pacer.buckets(_message("telegram", "-1001"))]
    assert group == ["telegram:bot", "telegram:chat:-1001", "telegram:group:-1001"]
    assert [b.name for b in pacer.buckets(_message("telegram", "77"))] == ["telegram:bot", "telegram:chat:77"]
    assert pacer.buckets(_message("webhook", "77")) == ()  # not paced
    assert [b.interval for b in pacer.buckets(_message("slack", "C1"))] == [1.0]


async def test_the_pacer_waits_pauses_and_lets_previews_go_last(store: PipelineStore) -> None:
    now = [1_800_000_000.0]
    pacer = Pacer(store, limits_with("telegram.group=2/2"), max_wait=1.0, clock=lambda: now[0])
    group, other = _message("telegram", "-5"), _message("telegram", "6")
    first = await pacer.final(group)
    await pacer.sent(group, first)  # one in flight per chat: the next waits for its answer
    second = await pacer.final(group)
    assert (first.granted, second.granted, second.at - first.at) == (True, True, 1.0)
    await pacer.sent(group, second)
    third = await pacer.final(group)
    assert (third.granted, third.at - now[0]) == (False, 2.0)  # further than max_wait
    assert not await pacer.preview(group)  # a final answer waits: previews keep off

    until = await pacer.rate_limited(group, 3)
    assert until == now[0] + 3 and await pacer.paused_until(group) == until
    assert await pacer.paused_until(other) == 0.0  # another chat is not held
    assert (await pacer.final(other)).at < until  # only the bot bucket (and its queue) holds it

    now[0] += 10
    assert await pacer.paused_until(group) < now[0]
    assert await pacer.preview(group)  # idle again
    assert not await pacer.preview(group)  # its own slot is recent
    assert (await pacer.final(group)).granted  # the final is not held by previews


async def test_a_send_leaving_late_holds_the_next_one_a_whole_interval(store: PipelineStore) -> None:
    now = [1_800_000_000.0]
    pacer = Pacer(store, limits_with("telegram.bot=off,telegram.group=off"), clock=lambda: now[0])
    chat = _message("telegram", "9")  # one per second
    first = await pacer.final(chat)
    slot = first.at
    await pacer.leaving(chat, slot)  # on time: nothing held
    assert await pacer.paused_until(chat) == 0.0
    await pacer.sent(chat, first)
    nxt = await pacer.final(chat)
    assert nxt.granted and nxt.at == slot + 1.0
    now[0] = nxt.at + 0.5  # it leaves half a second late
    await pacer.leaving(chat, nxt.at)
    assert await pacer.paused_until(chat) >= now[0] + 1.0
    await pacer.sent(chat, nxt)
    after = await pacer.final(chat)
    assert after.at >= now[0] + 1.0  # a second after it really left, not after its slot


async def test_previews_keep_off_a_handed_back_answers_slot_until_it_is_back(store: PipelineStore) -> None:
    """An answer whose slot is further than `max_wait` goes back to the outbox until then;
    a sender late to claim it again (a busy machine) must not find the chat idle and let a
    preview take the answer's place (it did, in a full run on a slow host)."""
    now = [1_800_000_000.0]
    pacer = Pacer(
        store, limits_with("telegram.bot=off,telegram.group=off"), max_wait=0.2, clock=lambda: now[0]
    )
    chat = _message("telegram", "9")  # one per second
    first = await pacer.final(chat)
    await pacer.sent(chat, first)
    later = await pacer.final(chat)
    assert not later.granted and later.at == first.at + 1.0  # handed back until its slot
    now[0] = later.at + 1.5  # the sender comes back for it late
    assert not await pacer.preview(chat)
    back = await pacer.final(chat)
    assert back.granted and back.at == now[0]
    await pacer.sent(chat, back)
    now[0] += 5.0
    assert await pacer.preview(chat)  # idle again once the answers are out


class _SlowPauses:
    """The port, whose pause writes take `seconds` of the pacer's clock (a cold connection)."""

    def __init__(self, store: PipelineStore, now: list[float], seconds: float) -> None:
        self._store, self._now, self._seconds = store, now, seconds
        self.pauses = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def pause_pace(self, names: list[str], until: float) -> None:
        await self._store.pause_pace(names, until)
        self.pauses += 1
        self._now[0] += self._seconds if self.pauses == 1 else 0.001


async def test_a_late_send_whose_hold_took_long_to_write_is_held_from_when_it_left(
    store: PipelineStore,
) -> None:
    """The send leaves after the hold is written: a slow write must not eat the interval
    (it did: the next answer reached Telegram 0.3 s after this one on a busy machine)."""
    now = [1_800_000_000.0]
    slow = _SlowPauses(store, now, seconds=0.3)
    pacer = Pacer(
        cast(PipelineStore, slow), limits_with("telegram.bot=off,telegram.group=off"), clock=lambda: now[0]
    )
    chat = _message("telegram", "9")  # one per second
    first = await pacer.final(chat)
    now[0] = first.at + 0.5  # late
    await pacer.leaving(chat, first.at)
    left = now[0]  # the send leaves when `leaving` returns
    assert slow.pauses == 2
    await pacer.sent(chat, first)
    after = await pacer.final(chat)
    assert after.at >= left + 1.0


async def test_card_edits_take_the_card_bucket_and_final_answers_keep_the_chat_limits(
    store: PipelineStore,
) -> None:
    now = [1_800_000_000.0]
    pacer = Pacer(store, limits_with(""), max_wait=1.0, clock=lambda: now[0])
    group = _message("dingtalk", "cidG==")
    assert DEFAULT_LIMITS["dingtalk"]["card"] == Rate(20, 1)
    assert await pacer.preview(group)  # the card is opened: a message in the chat
    final = await pacer.final(group)  # the chat's next message: 3 s later (20 a minute)
    assert (final.granted, final.at - now[0]) == (False, 3.0)
    assert not await pacer.preview(group)  # another message preview: the chat is busy
    # Updates of the card go on meanwhile, spaced by the card bucket (20 a second, per bot).
    assert await pacer.preview(group, card=True)
    assert not await pacer.preview(group, card=True)  # its own slot is recent
    now[0] += 0.1
    assert await pacer.preview(_message("dingtalk", "cidOther=="), card=True)
    now[0] += 0.1
    assert await pacer.preview(group, card=True)
    # ... and take nothing from the chat: the answer's slot is where it was.
    later = await pacer.final(group)
    assert (later.granted, later.at) == (False, final.at)
    # A card update's 429 pauses the card bucket, not the chat's answers.
    await pacer.rate_limited(group, 5, card=True)
    assert not await pacer.preview(group, card=True)
    assert await pacer.paused_until(group) == 0.0
    now[0] = final.at
    assert (await pacer.final(group)).granted
    # A channel without a card limit paces card edits as chat messages, as before.
    feishu = _message("feishu", "oc_1")
    assert await pacer.preview(feishu, card=True)
    assert not await pacer.preview(feishu)
    assert limits_with("feishu.card=10/1")["feishu"]["card"] == Rate(10, 1)
