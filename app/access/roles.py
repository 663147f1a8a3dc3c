"""Who a sender is in a chat: `owner`, `admin`, `member` or `guest` (docs/access.md).

A session key is never a credential, and neither is being in a group: commands and tools
declare the role they need and are checked against the role found here.

Where a role comes from, strongest wins:

- a direct chat: the person is the owner of their own conversation (deferred work, a
  reminder's fire, carries the role of the person who asked for it);
- the channel's `admins` setting (`<CHANNEL>_ADMINS`) and stored `admin` entries
  (`chatgate access add <channel> admin <sender>`, the runtime list): admin;
- what the platform says: the adapter puts it on the event (`metadata["role"]`) when the
  payload carries it (OneBot `sender.role`, DingTalk, Discord slash commands), or answers
  a lookup cached for `role_cache_seconds`: `chat_roles(chat)` for a whole chat
  (Telegram's getChatAdministrators), `sender_role(chat, sender)` for one person
  (Slack's users.info: workspace owners, admins, guest accounts);
- otherwise a member; a guest where the platform says so, or where the channel serves
  only listed people (allowlist, pairing) and this sender is let in only through the
  group's `chat` entry.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from enum import IntEnum
from typing import Any

import structlog

from app.channel import ChannelSettings
from app.events import ROLE_KEY, ChatType, InboundEvent

log = structlog.get_logger(__name__)


class Role(IntEnum):
    """Ordered: a role may do what every lower role may."""

    GUEST = 0
    MEMBER = 1
    ADMIN = 2
    OWNER = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, value: Any) -> Role | None:
        """A role from its name (`"admin"`), None for anything else."""
        if isinstance(value, Role):
            return value
        if isinstance(value, str):
            return _BY_NAME.get(value.strip().lower())
        return None


_BY_NAME = {role.name.lower(): role for role in Role}


def least(roles: Iterable[Role]) -> Role:
    """The least privileged of `roles` (a turn several senders wrote runs with it)."""
    return min(roles, default=Role.GUEST)


# channel → chat id → {sender id: role name}; an adapter's `chat_roles`.
ChatRoles = Callable[[str], Awaitable[Mapping[str, str]]]
# (chat id, sender id) → the sender's role name there, or None; an adapter's `sender_role`.
SenderRole = Callable[[str, str], Awaitable[str | None]]
# Whether a stored entry makes the sender an admin, or lets them in personally.
StoredEntry = Callable[[str, str, str], Awaitable[bool]]  # (channel, kind, sender id)


class Roles:
    """The role of an event's sender, with the platform's answers cached for a short while."""

    def __init__(
        self,
        channel_settings: Mapping[str, ChannelSettings],
        *,
        lookups: Mapping[str, ChatRoles] | None = None,
        sender_lookups: Mapping[str, SenderRole] | None = None,
        stored: StoredEntry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.channel_settings = channel_settings
        self.lookups = dict(lookups or {})
        self.sender_lookups = dict(sender_lookups or {})
        self.stored = stored
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, Mapping[str, str]]] = {}
        self._senders: dict[tuple[str, str, str], tuple[float, str | None]] = {}
        self._entries: dict[tuple[str, str, str], tuple[float, bool]] = {}
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    def _ttl(self, channel: str) -> float:
        settings = self.channel_settings.get(channel)
        return settings.role_cache_seconds if settings is not None else 60.0

    async def of(self, event: InboundEvent) -> Role:
        if event.chat_type is not ChatType.GROUP:
            # The person's own conversation; work done for someone less trusted (a reminder
            # a group member set) says so, and a role on the event can only lower this.
            return Role.parse(event.metadata.get(ROLE_KEY)) or Role.OWNER
        settings = self.channel_settings.get(event.channel)
        if settings is not None and event.sender_id in settings.admins:
            return Role.ADMIN
        if await self._entry(event.channel, "admin", event.sender_id):
            return Role.ADMIN
        said = Role.parse(event.metadata.get(ROLE_KEY))
        if said is None:
            said = await self._looked_up(event)
        if said is not None and said is not Role.MEMBER:
            return said
        if (
            settings is not None
            and _listed_only(settings)
            and not await self._personally_allowed(settings, event)
        ):
            return Role.GUEST
        return Role.MEMBER

    async def _personally_allowed(self, settings: ChannelSettings, event: InboundEvent) -> bool:
        if event.sender_id in settings.allowed_senders:
            return True
        return await self._entry(event.channel, "sender", event.sender_id)

    async def _entry(self, channel: str, kind: str, sender_id: str) -> bool:
        if self.stored is None:
            return False
        key = (channel, kind, sender_id)
        now = self.clock()
        cached = self._entries.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        found = await self.stored(channel, kind, sender_id)
        self._entries[key] = (now + self._ttl(channel), found)
        return found

    async def _looked_up(self, event: InboundEvent) -> Role | None:
        one = self.sender_lookups.get(event.channel)
        if one is not None:
            return await self._sender_looked_up(event, one)
        lookup = self.lookups.get(event.channel)
        if lookup is None:
            return None
        key = (event.channel, event.chat_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:  # one lookup per chat at a time: a burst asks the platform once
            now = self.clock()
            cached = self._cache.get(key)
            if cached is None or cached[0] <= now:
                try:
                    roles = await lookup(event.chat_id)
                except Exception as exc:  # the platform away: no elevated role, never an error
                    log.warning("role_lookup_failed", channel=event.channel, error=str(exc))
                    return None
                cached = (now + self._ttl(event.channel), dict(roles))
                self._cache[key] = cached
        return Role.parse(cached[1].get(event.sender_id))

    async def _sender_looked_up(self, event: InboundEvent, lookup: SenderRole) -> Role | None:
        key = (event.channel, event.chat_id, event.sender_id)
        now = self.clock()
        cached = self._senders.get(key)
        if cached is None or cached[0] <= now:
            try:
                said = await lookup(event.chat_id, event.sender_id)
            except Exception as exc:  # as for a chat's lookup: a member, never an error
                log.warning("role_lookup_failed", channel=event.channel, error=str(exc))
                return None
            cached = (now + self._ttl(event.channel), said)
            self._senders[key] = cached
        return Role.parse(cached[1])


def _listed_only(settings: ChannelSettings) -> bool:
    mode = settings.access or ("allowlist" if settings.allowed_senders else "open")
    return mode != "open"
