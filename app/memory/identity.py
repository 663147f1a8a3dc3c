"""Who a memory belongs to: channel identities, optionally linked to one person.

A sender is known by its channel identity, `"{channel}:{sender_id}"` with both
components escaped like session keys (so two different pairs never give the same
string). An operator can link identities on different channels to one person id; user
memory is then stored under `person:{person_id}` and shared by exactly those identities.
"""

from __future__ import annotations

import re

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


def identity_of(channel: str, sender_id: str) -> str:
    """The channel identity of a sender (an owner of user memory until linked)."""
    return f"{escape_key_component(channel)}:{escape_key_component(sender_id)}"


def is_person(channel: str) -> bool:
    return channel not in NO_PERSON_CHANNELS


def person_owner(person_id: str) -> str:
    if not _PERSON_ID.match(person_id):
        raise ValueError("a person id is 1-200 characters of A-Z a-z 0-9 _ . @ -")
    return PERSON_PREFIX + person_id


def _check_identity(identity: str) -> None:
    channel, sep, sender = identity.partition(":")
    if not sep or not channel or not sender or channel == "person":
        raise ValueError(f"an identity looks like 'channel:sender_id', got {identity!r}")


async def resolve_owner(conn: AsyncConnection, identity: str) -> str:
    """The owner of `identity`'s user memory: its person if linked, else the identity."""
    person = (
        await conn.execute(select(identity_links.c.person_id).where(identity_links.c.identity == identity))
    ).scalar()
    return person_owner(person) if person else identity


class IdentityLinks:
    """Link and unlink channel identities (operator actions: CLI `python -m app.memory`)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def link(self, identity: str, person_id: str, *, created_by: str | None = None) -> None:
        """Make `identity` one of `person_id`'s; its existing user memory moves to the person."""
        _check_identity(identity)
        owner = person_owner(person_id)
        async with self.engine.begin() as conn:
            await conn.execute(delete(identity_links).where(identity_links.c.identity == identity))
            await conn.execute(
                insert_ignore(conn, identity_links, ["identity"]).values(
                    identity=identity, person_id=person_id, created_at=utcnow(), created_by=created_by
                )
            )
            # Move the identity's memories; where the person already has that key, the
            # person's entry wins and the identity's duplicate is dropped.
            taken = select(memories.c.key).where(
                memories.c.scope == "user", memories.c.owner == owner, memories.c.key.is_not(None)
            )
            await conn.execute(
                update(memories)
                .where(
                    memories.c.scope == "user",
                    memories.c.owner == identity,
                    memories.c.key.not_in(taken.scalar_subquery()),
                )
                .values(owner=owner, updated_at=utcnow())
            )
            await conn.execute(
                delete(memories).where(memories.c.scope == "user", memories.c.owner == identity)
            )

    async def unlink(self, identity: str) -> bool:
        """Forget the link; memories stay with the person (the identity starts empty)."""
        async with self.engine.begin() as conn:
            result = await conn.execute(delete(identity_links).where(identity_links.c.identity == identity))
        return bool(result.rowcount)

    async def identities(self, person_id: str | None = None) -> list[dict[str, str]]:
        query = select(identity_links).order_by(identity_links.c.person_id, identity_links.c.identity)
        if person_id is not None:
            query = query.where(identity_links.c.person_id == person_id)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [{"identity": r["identity"], "person_id": r["person_id"]} for r in rows]
