"""Outbound pacing limits: the platforms' published rates, and `PACING_LIMITS` over them.

Read by the settings (to check `PACING_LIMITS` at start-up) and by `app.pipeline.pacing`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# `card`: a channel's native streaming edits (card updates), per bot, instead of the chat
# buckets: a platform counts them against its API, not against messages to the chat.
SCOPES = ("bot", "chat", "group", "card")


@dataclass(frozen=True)
class Rate:
    """At most `count` sends in any `seconds`."""

    count: int
    seconds: float

    @property
    def interval(self) -> float:
        return self.seconds / self.count

    def __str__(self) -> str:
        return f"{self.count}/{self.seconds:g}"


# The platforms' published limits (docs/operations.md lists the sources). Where a
# platform counts per chat and per group alike (Feishu, Slack, Discord), it is the chat.
DEFAULT_LIMITS: Mapping[str, Mapping[str, Rate]] = {
    # core.telegram.org/bots/faq: ~30 messages/s overall, 1/s per chat, 20/min per group.
    "telegram": {"bot": Rate(30, 1), "chat": Rate(1, 1), "group": Rate(20, 60)},
    # api.slack.com rate limits: chat.postMessage about 1 message per second per channel.
    "slack": {"chat": Rate(1, 1)},
    # Discord: 50 requests/s per bot (global); message create 5 per 5 s per channel.
    "discord": {"bot": Rate(50, 1), "chat": Rate(5, 5)},
    # Feishu im/v1/messages: 50/s per app; 5 QPS to one user or one group.
    "feishu": {"bot": Rate(50, 1), "chat": Rate(5, 1)},
    # DingTalk robots: at most 20 messages a minute per robot (then throttled 10 minutes).
    # An AI card's streaming update (`PUT /v1.0/card/streaming`) is an OpenAPI call, not a
    # message: an internal app may call each server API 20 times a second.
    "dingtalk": {"chat": Rate(20, 60), "card": Rate(20, 1)},
    # WeCom app messages: at most 30 a minute from one app to one member.
    "wecom": {"chat": Rate(30, 60)},
    # QQ official bot and OneBot bridges publish no per-second figure: one a second per
    # chat keeps a QQ account clear of the risk control that bans bursts.
    "qq": {"chat": Rate(1, 1)},
    "onebot": {"chat": Rate(1, 1)},
    # WhatsApp Cloud API: 80 messages/s per number; one message every 6 s to one user.
    "whatsapp": {"bot": Rate(80, 1), "chat": Rate(10, 60)},
}


def parse_limits(text: str) -> dict[str, dict[str, Rate | None]]:
    """`PACING_LIMITS`: `channel.scope=count/seconds`, comma-separated; `off` drops a limit.

    `telegram.group=20/60,slack.chat=1/1,discord.bot=off`
    """
    found: dict[str, dict[str, Rate | None]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        target, sep, value = item.partition("=")
        channel, dot, scope = target.strip().partition(".")
        if not sep or not dot or scope not in SCOPES or not channel:
            scopes = "|".join(SCOPES)
            raise ValueError(f"PACING_LIMITS: {item!r} is not channel.scope=count/seconds ({scopes})")
        value = value.strip()
        if value == "off":
            found.setdefault(channel, {})[scope] = None
            continue
        count, slash, seconds = value.partition("/")
        try:
            rate = Rate(int(count), float(seconds))
        except ValueError:
            rate = None
        if not slash or rate is None or rate.count < 1 or rate.seconds <= 0:
            raise ValueError(f"PACING_LIMITS: {item!r} needs count/seconds, both positive")
        found.setdefault(channel, {})[scope] = rate
    return found


def limits_with(overrides: str) -> dict[str, dict[str, Rate]]:
    """The defaults with `PACING_LIMITS` applied."""
    limits = {channel: dict(rates) for channel, rates in DEFAULT_LIMITS.items()}
    for channel, rates in parse_limits(overrides).items():
        mine = limits.setdefault(channel, {})
        for scope, rate in rates.items():
            if rate is None:
                mine.pop(scope, None)
            else:
                mine[scope] = rate
    return limits
