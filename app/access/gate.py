"""The access and quota decision for one inbound event, made at ingest before it is stored.

`check_access`: the channel's mode. `open` serves everyone; `allowlist` serves senders on
the static `allowed_senders` or a stored `sender` entry, and everyone in a group chat with a
stored `chat` entry; `pairing` is `allowlist` where an unknown sender in a direct chat gets
a one-time code instead of silence. The static `allowed_chats` limits the groups served
in every mode, as before.

`check_quota`: messages per minute (counted here, as each message arrives) and model
tokens per UTC day (counted after each turn, `count_tokens`), per sender and per session,
from the channel's settings and the serving agent's profile. A sender's count is kept per
channel, and per agent for an agent's own limits; a session's count is its key's. Over a
limit, the sender is told once per window and the event goes no further.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access.attempts import Attempts
from app.access.counters import DAY, MINUTE, QuotaCounters, window_of
from app.access.limits import QuotaLimits, strictest
from app.access.notices import Notices
from app.access.store import AccessStore
from app.access.texts import say
from app.channel import ChannelSettings
from app.events import ChatType, InboundEvent, escape_key_component

log = structlog.get_logger(__name__)

AgentLimits = Callable[[InboundEvent], tuple[str, QuotaLimits]]
"""The serving agent's name and its limits, for an event whose agent is set (`app.agents`)."""

NO_LIMITS = QuotaLimits()
_SUBJECT_MAX = 800  # access_counters.subject
# Code requests one unknown sender may make per hour; beyond them nothing is minted or said.
PAIRING_ATTEMPTS_PER_HOUR = 10


def access_mode(settings: ChannelSettings) -> str:
    """The channel's mode; unset keeps the old rule: a sender list means an allowlist."""
    return settings.access or ("allowlist" if settings.allowed_senders else "open")


@dataclass(frozen=True)
class Verdict:
    """An event that goes no further: why (not_allowed, pairing, quota), and what was said."""

    reason: str
    notice: str | None = None


def _subject(*components: str) -> str:
    subject = ":".join(escape_key_component(c) for c in components)
    if len(subject) <= _SUBJECT_MAX:
        return subject
    return subject[: _SUBJECT_MAX - 65] + "#" + hashlib.sha256(subject.encode()).hexdigest()


class AccessGate:
    def __init__(
        self,
        engine: AsyncEngine,
        channel_settings: Mapping[str, ChannelSettings],
        *,
        agent_limits: AgentLimits | None = None,
        notices: Notices | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.channel_settings = channel_settings
        self.store = AccessStore(engine)
        self.counters = QuotaCounters(engine)
        self.notices = notices or Notices(engine)
        self.agent_limits: AgentLimits = agent_limits or (lambda event: ("", NO_LIMITS))
        self._agents_limited = agent_limits is not None
        self.clock = clock
        # Read once: each channel's limits (the agents' come with `agent_limits`).
        self._channel_limits = {name: QuotaLimits.of(cs) for name, cs in channel_settings.items()}
        self.pairing_attempts = Attempts(
            engine,
            "pairing",
            limit=PAIRING_ATTEMPTS_PER_HOUR,
            window_seconds=3600,
            clock=lambda: self.clock(),
        )

    # --- who may talk -----------------------------------------------------------------

    async def check_access(self, settings: ChannelSettings, event: InboundEvent) -> Verdict | None:
        """None when the sender may talk here; else why not (a pairing code may be sent)."""
        group = event.chat_type is ChatType.GROUP
        if group and not settings.chat_allowed(event.chat_id):
            return Verdict("not_allowed")
        mode = access_mode(settings)
        if mode == "open" or event.sender_id in settings.allowed_senders:
            return None
        if mode == "allowlist" and not group and settings.answer_unknown_dm:
            return None  # as before: direct messages from anyone are still answered
        if await self.store.allowed(event.channel, event.sender_id, event.chat_id if group else None):
            return None
        if mode == "allowlist":
            return Verdict("not_allowed")
        if group:  # codes are given in direct chats only, never in front of a group
            return Verdict("not_allowed")
        if not await self.pairing_attempts.allow(_subject("pairing", event.channel, event.sender_id)):
            return Verdict("pairing")
        code = await self.store.request_code(
            event.channel,
            event.sender_id,
            event.chat_id,
            event.text,
            ttl=settings.pairing_code_ttl_seconds,
            max_pending=settings.pairing_max_pending,
        )
        if code is None:  # one is pending already (nothing more is said), or too many are
            return Verdict("pairing")
        minutes = max(1, round(settings.pairing_code_ttl_seconds / 60))
        notice = say("pairing.code", settings.locale, code=code, minutes=minutes)
        await self.notices.send(event, notice)
        log.info("pairing_code_sent", channel=event.channel, sender_id=event.sender_id)
        return Verdict("pairing", notice)

    # --- how much ---------------------------------------------------------------------

    def may_limit(self, settings: ChannelSettings, channel: str) -> bool:
        """Whether any quota could apply to an event of `channel` (its own, or an agent's)."""
        return self._agents_limited or (self._channel_limits.get(channel) or QuotaLimits.of(settings)).any

    def _limits(self, settings: ChannelSettings, event: InboundEvent, metric: str) -> dict[str, int]:
        """The limits that apply to `event` for `metric` (messages, tokens), by counter subject."""
        channel = self._channel_limits.get(event.channel) or QuotaLimits.of(settings)
        agent, own = self.agent_limits(event)
        if not channel.any and not own.any:
            return {}
        per = "messages_per_minute" if metric == "messages" else "tokens_per_day"
        out: dict[str, int] = {}
        sender = getattr(channel, f"sender_{per}")
        if sender is not None:
            out[_subject("sender", event.channel, event.sender_id)] = sender
        agent_sender = getattr(own, f"sender_{per}")
        if agent_sender is not None:
            out[_subject("agent_sender", agent, event.channel, event.sender_id)] = agent_sender
        session = strictest(getattr(channel, f"session_{per}"), getattr(own, f"session_{per}"))
        if session is not None:
            out[_subject("session", event.session_key)] = session
        return out

    async def check_quota(self, settings: ChannelSettings, event: InboundEvent) -> Verdict | None:
        """None when the event is within its quotas (its message is counted); else the verdict."""
        now = self.clock()
        tokens = self._limits(settings, event, "tokens")
        if tokens:
            window = window_of(now, DAY)
            used = await self.counters.read("tokens", list(tokens), window)
            over = next((s for s, limit in tokens.items() if used[s] >= limit), None)
            if over is not None:
                return await self._over(settings, event, "tokens", over, window)
        messages = self._limits(settings, event, "messages")
        if messages:
            window = window_of(now, MINUTE)
            counts = await self.counters.add("messages", dict.fromkeys(messages, 1), window)
            over = next((s for s, limit in messages.items() if counts[s] > limit), None)
            if over is not None:
                return await self._over(settings, event, "messages", over, window)
        return None

    async def _over(
        self, settings: ChannelSettings, event: InboundEvent, metric: str, subject: str, window: int
    ) -> Verdict:
        log.info("quota_exceeded", channel=event.channel, metric=metric, subject=subject)
        if not await self.counters.claim_notice(metric, subject, window):
            return Verdict("quota")  # told already in this window
        notice = say(f"quota.{metric}", settings.locale)
        await self.notices.send(event, notice)
        return Verdict("quota", notice)

    async def count_tokens(self, event: InboundEvent, tokens: int) -> None:
        """Add a turn's model tokens to the counters of the limits that apply to its event.

        Counted only where a limit is set, so quotas cost nothing where there are none.
        """
        settings = self.channel_settings.get(event.channel)
        if settings is None or tokens <= 0:
            return
        limits = self._limits(settings, event, "tokens")
        if limits:
            await self.counters.add("tokens", dict.fromkeys(limits, tokens), window_of(self.clock(), DAY))

    async def prune(self) -> int:
        """Forget counters of windows long past, and pairing requests expired a day ago."""
        now = self.clock()
        gone = await self.counters.prune(window_of(now, DAY) - DAY)
        gone += await self.store.prune(datetime.fromtimestamp(now, UTC) - timedelta(days=1))
        return gone
