"""Who a memory belongs to: channel identities, optionally linked to one person.

A sender is known by its channel identity, `"{channel}:{sender_id}"` with both
components escaped like session keys (so two different pairs never give the same
string). An operator can link identities on different channels to one person id; user
memory is then stored under `person:{person_id}` and shared by exactly those identities.

Operators name an identity as the platform sends it, `channel:sender_id` (everything
after the first colon is the sender id); `parse_identity` checks and escapes it. Links
are made through the CLI (`python -m app.memory`) or the admin API
(`/admin/api/identity-links`), both on `IdentityLinks`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.models import identity_links, memories, utcnow
from app.db.upsert import insert_ignore
from app.events import escape_key_component

PERSON_PREFIX = "person:"
# Channels whose events are not written by a person (a cron fire's "sender" is the
# scheduler, shared by every job): they have no user memory, so nothing stored during a
# scheduled run can surface in another person's scheduled run.
NO_PERSON_CHANNELS = frozenset({"cron"})
_PERSON_ID = re.compile(r"^[A-Za-z0-9_.@-]{1,200}$")
# Channel names are adapter names (`telegram`, `wechat-mp`, …); anything else is a typo.
_CHANNEL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_CONTROL = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")  # and lone surrogates: no UTF-8 form
MAX_IDENTITY_CHARS = 600  # the identity_links.identity column, escaped form


@dataclass(frozen=True)
class IdentityLink:
    identity: str  # escaped, as stored and as memory owners are named
    channel: str  # as the platform sends it
    sender_id: str
    person_id: str
    created_at: datetime
    created_by: str | None


def identity_of(channel: str, sender_id: str) -> str:
    """The channel identity of a sender (an owner of user memory until linked)."""
    return f"{escape_key_component(channel)}:{escape_key_component(sender_id)}"


def is_person(channel: str) -> bool:
    return channel not in NO_PERSON_CHANNELS


def check_person_id(person_id: str) -> str:
    if not _PERSON_ID.fullmatch(person_id):
        raise ValueError(f"a person id is 1-200 characters of A-Z a-z 0-9 _ . @ -, got {person_id!r}")
    return person_id


def person_owner(person_id: str) -> str:
    return PERSON_PREFIX + check_person_id(person_id)


def parse_identity(text: str) -> str:
    """`channel:sender_id` as the platform sends it (the sender id may contain colons),
    checked, as the escaped identity that owns memory; ValueError says what is wrong."""
    channel, sep, sender = text.partition(":")
    if not sep or not channel or not sender:
        raise ValueError(f"an identity looks like 'channel:sender_id', got {text!r}")
    if not _CHANNEL.fullmatch(channel):
        raise ValueError(f"a channel name is 1-64 characters of A-Z a-z 0-9 _ . -, got {channel!r}")
    if channel == "person" or not is_person(channel):
        raise ValueError(f"identities of channel {channel!r} cannot be linked to a person")
    if _CONTROL.search(sender) or sender != sender.strip():
        raise ValueError("a sender id has no control characters or surrogates and no outer spaces")
    identity = identity_of(channel, sender)
    if len(identity) > MAX_IDENTITY_CHARS:
        raise ValueError(f"an identity is at most {MAX_IDENTITY_CHARS} characters (escaped)")
    return identity


def split_identity(identity: str) -> tuple[str, str]:
    """The (channel, sender_id) an escaped identity was made from."""
    channel, _, sender = identity.partition(":")
    return _unescape(channel), _unescape(sender)


def _unescape(component: str) -> str:
    return component.replace("%3A", ":").replace("%25", "%")


def _check_identity(identity: str) -> None:
    """An escaped identity (as stored), checked before anything is written."""
    channel, sep, sender = identity.partition(":")
    if not sep or not channel or not sender or channel == "person":
        raise ValueError(f"an identity looks like 'channel:sender_id', got {identity!r}")
    if len(identity) > MAX_IDENTITY_CHARS or _CONTROL.search(identity):
        raise ValueError(f"not a valid identity: {identity!r}")


async def resolve_owner(conn: AsyncConnection, identity: str) -> str:
    """The owner of `identity`'s user memory: its person if linked, else the identity."""
    person = (
        await conn.execute(select(identity_links.c.person_id).where(identity_links.c.identity == identity))
    ).scalar()
    return person_owner(person) if person else identity


class IdentityLinks:
    """Link and unlink channel identities (operator actions: the CLI and the admin API).

    Identities here are escaped ones (`identity_of`, `parse_identity`).
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def link(self, identity: str, person_id: str, *, created_by: str | None = None) -> str | None:
        """Make `identity` one of `person_id`'s; its existing user memory moves to the person.

        Returns the person it was linked to before, if any (its memory stays there).
        """
        _check_identity(identity)
        owner = person_owner(person_id)
        async with self.engine.begin() as conn:
            previous = (
                await conn.execute(
                    select(identity_links.c.person_id).where(identity_links.c.identity == identity)
                )
            ).scalar()
            await conn.execute(delete(identity_links).where(identity_links.c.identity == identity))
            await conn.execute(
                insert_ignore(conn, identity_links, ["identity"]).values(
                    identity=identity, person_id=person_id, created_at=utcnow(), created_by=created_by
                )
            )
            # Move the identity's memories; where the person already has that key (in the
            # same namespace), the person's entry wins and the identity's duplicate is dropped.
            mine = memories.alias("person_entry")
            taken = select(mine.c.id).where(
                mine.c.scope == "user",
                mine.c.owner == owner,
                mine.c.namespace == memories.c.namespace,
                mine.c.key == memories.c.key,
            )
            await conn.execute(
                update(memories)
                .where(
                    memories.c.scope == "user",
                    memories.c.owner == identity,
                    ~taken.exists(),
                )
                .values(owner=owner, updated_at=utcnow())
            )
            await conn.execute(
                delete(memories).where(memories.c.scope == "user", memories.c.owner == identity)
            )
        return previous if isinstance(previous, str) else None

    async def unlink(self, identity: str) -> bool:
        """Forget the link; memories stay with the person (the identity starts empty)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(identity_links).where(identity_links.c.identity == identity))
        return bool(result.rowcount)

    async def links(self, person_id: str | None = None, *, identity: str | None = None) -> list[IdentityLink]:
        """Links ordered by person, then identity; only one person's or one identity's when given."""
        query = select(identity_links).order_by(identity_links.c.person_id, identity_links.c.identity)
        if person_id is not None:
            query = query.where(identity_links.c.person_id == person_id)
        if identity is not None:
            query = query.where(identity_links.c.identity == identity)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [
            IdentityLink(
                identity=r["identity"],
                channel=split_identity(r["identity"])[0],
                sender_id=split_identity(r["identity"])[1],
                person_id=r["person_id"],
                created_at=r["created_at"],
                created_by=r["created_by"],
            )
            for r in rows
        ]

    async def identities(self, person_id: str | None = None) -> list[dict[str, str]]:
        return [
            {"identity": link.identity, "person_id": link.person_id} for link in await self.links(person_id)
        ]
