"""People's data on request: export everything stored about one person, or erase it.

A person is one channel identity (`telegram:42`, as the platform sends it) or a linked
person id (`app.memory.identity`), which stands for all the identities linked to it.
What belongs to them:

- their **direct conversations** (a direct chat's session is about them alone): every
  message of every generation, the replies in the outbox, the run traces' errors and
  details, approval arguments, and the session workspace with its files;
- in **groups**: their own messages only (the user messages made from their events) and
  the files they sent; other members' messages and the bot's answers stay;
- the inbox events they sent (dead letters included), their user memory, memory of their
  direct sessions, identity links, the `/sessions` sender records, access entries and
  pairing requests.

Erasure keeps the history's shape (append-only, the tool-call structure legal): a message
becomes a tombstone — its text replaced, its parts, tool arguments and results emptied —
never a gap. It returns a receipt of what was removed, counted per kind.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.workspace import session_dir
from app.db.models import (
    access_entries,
    access_pairings,
    approvals,
    identity_links,
    inbox,
    memories,
    messages,
    outbox,
    runs,
    session_senders,
    sessions,
)
from app.events import ChatType, InboundEvent, TextPart
from app.memory.identity import identity_of, person_owner, split_identity
from app.pipeline.inbox_files import InboxFiles

TOMBSTONE = "[erased on request]"


class UnknownPerson(Exception):
    """No identity or person matched: nothing to export or erase."""


@dataclass(frozen=True)
class Person:
    identities: tuple[tuple[str, str], ...]  # (channel, sender id as the platform sends it)
    person_id: str | None = None

    @property
    def memory_owners(self) -> set[str]:
        owners = {identity_of(channel, sender) for channel, sender in self.identities}
        if self.person_id is not None:
            owners.add(person_owner(self.person_id))
        return owners

    def sent(self, payload: dict[str, Any]) -> bool:
        return (payload.get("channel"), payload.get("sender_id")) in self.identities


@dataclass
class Footprint:
    """Where a person's data is: found once, then exported or erased."""

    events: list[dict[str, Any]] = field(default_factory=list)  # inbox rows they sent
    direct_keys: set[str] = field(default_factory=set)
    direct_session_ids: list[int] = field(default_factory=list)
    group_message_ids: list[int] = field(default_factory=list)  # their messages in groups
    group_run_ids: list[int] = field(default_factory=list)  # runs that answered only them
    group_files: list[Path] = field(default_factory=list)  # relative to the workspace root


async def find_person(
    engine: AsyncEngine, *, identity: str | None = None, person: str | None = None
) -> Person:
    """`identity` is `channel:sender_id`; `person` a person id (all its linked identities)."""
    if (identity is None) == (person is None):
        raise ValueError("give an identity (channel:sender_id) or a person id, not both")
    if identity is not None:
        channel, sep, sender = identity.partition(":")
        if not sep or not channel or not sender:
            raise ValueError(f"an identity is channel:sender_id, got {identity!r}")
        return Person(((channel, sender),))
    async with engine.connect() as conn:
        linked = (
            await conn.execute(select(identity_links.c.identity).where(identity_links.c.person_id == person))
        ).scalars()
        identities = tuple(split_identity(i) for i in linked)
    if not identities:
        raise UnknownPerson(f"no identity is linked to person {person!r}")
    return Person(identities, person)


async def footprint(engine: AsyncEngine, who: Person) -> Footprint:
    found = Footprint()
    channels = sorted({channel for channel, _ in who.identities})
    async with engine.connect() as conn:
        rows = (
            await conn.execute(
                select(inbox.c.id, inbox.c.event_id, inbox.c.session_key, inbox.c.payload, inbox.c.status)
                .where(inbox.c.channel.in_(channels))
                .order_by(inbox.c.id)
            )
        ).mappings()
        for row in rows:
            payload = row["payload"] or {}
            if who.sent(payload):
                found.events.append(dict(row))
                if payload.get("chat_type") == ChatType.DIRECT.value:
                    found.direct_keys.add(row["session_key"])
        if found.direct_keys:
            found.direct_session_ids = list(
                (
                    await conn.execute(select(sessions.c.id).where(sessions.c.key.in_(found.direct_keys)))
                ).scalars()
            )
        group_events = {e["event_id"]: e for e in found.events if e["session_key"] not in found.direct_keys}
        if group_events:
            mine = (
                await conn.execute(
                    select(messages.c.id, messages.c.event_id, sessions.c.key, sessions.c.generation)
                    .join(sessions, sessions.c.id == messages.c.session_id)
                    .where(messages.c.event_id.in_(group_events), messages.c.role == "user")
                )
            ).all()
            files = InboxFiles(None)
            for message_id, event_id, key, generation in mine:
                found.group_message_ids.append(message_id)
                event = InboundEvent.model_validate(group_events[event_id]["payload"])
                for path in files.paths(event).values():
                    found.group_files.append(session_dir(key, generation) / path)
            # The bot's answers to them alone repeat what they said: a run whose events
            # were all theirs goes too (one that also served others stays).
            group_keys = {e["session_key"] for e in group_events.values()}
            for run_id, event_ids in (
                await conn.execute(
                    select(runs.c.id, runs.c.event_ids).where(runs.c.session_key.in_(group_keys))
                )
            ).all():
                if event_ids and set(event_ids) <= group_events.keys():
                    found.group_run_ids.append(run_id)
            if found.group_run_ids:
                found.group_message_ids += list(
                    (
                        await conn.execute(
                            select(messages.c.id).where(
                                messages.c.run_id.in_(found.group_run_ids), messages.c.role != "user"
                            )
                        )
                    ).scalars()
                )
    return found


async def export(engine: AsyncEngine, who: Person) -> dict[str, Any]:
    """Everything stored about `who`, as JSON-ready data."""
    found = await footprint(engine, who)
    owners = who.memory_owners
    async with engine.connect() as conn:
        conversations = []
        if found.direct_session_ids:
            for session in (
                await conn.execute(
                    select(sessions)
                    .where(sessions.c.id.in_(found.direct_session_ids))
                    .order_by(sessions.c.id)
                )
            ).mappings():
                history = (
                    await conn.execute(
                        select(messages)
                        .where(messages.c.session_id == session["id"])
                        .order_by(messages.c.seq)
                    )
                ).mappings()
                conversations.append({**_plain(session), "messages": [_plain(m) for m in history]})
        in_groups = []
        if found.group_message_ids:
            in_groups = [
                _plain(m)
                for m in (
                    await conn.execute(
                        select(messages)
                        .where(messages.c.id.in_(found.group_message_ids))
                        .order_by(messages.c.id)
                    )
                ).mappings()
            ]
        memory = [
            _plain(m)
            for m in (
                await conn.execute(select(memories).where(_memory_of(owners, found.direct_keys)))
            ).mappings()
        ]
        links = [
            _plain(m)
            for m in (
                await conn.execute(select(identity_links).where(identity_links.c.identity.in_(owners)))
            ).mappings()
        ]
        usage = [
            _plain(r)
            for r in (
                await conn.execute(
                    select(
                        runs.c.id,
                        runs.c.session_key,
                        runs.c.model,
                        runs.c.prompt_tokens,
                        runs.c.completion_tokens,
                        runs.c.started_at,
                        runs.c.outcome,
                    ).where(runs.c.session_id.in_(found.direct_session_ids or [-1]))
                )
            ).mappings()
        ]
    return {
        "identities": [f"{c}:{s}" for c, s in who.identities],
        "person_id": who.person_id,
        "direct_conversations": conversations,
        "messages_in_groups": in_groups,
        "events": [{k: _json(v) for k, v in e.items()} for e in found.events],
        "memory": memory,
        "identity_links": links,
        "usage": usage,
    }


def _memory_of(owners: set[str], direct_keys: Iterable[str]) -> Any:
    return or_(
        (memories.c.scope == "user") & memories.c.owner.in_(owners),
        (memories.c.scope == "session") & memories.c.owner.in_(list(direct_keys) or [""]),
    )


async def erase(engine: AsyncEngine, who: Person, workspace_root: str | None) -> dict[str, int]:
    """Erase `who` everywhere; the receipt counts what was removed, per kind."""
    found = await footprint(engine, who)
    owners = who.memory_owners
    receipt: dict[str, int] = {}
    tomb_parts = [TextPart(text=TOMBSTONE).model_dump(mode="json")]
    async with engine.begin() as conn:
        history_ids = messages.c.session_id.in_(found.direct_session_ids or [-1]) | messages.c.id.in_(
            found.group_message_ids or [-1]
        )
        # The shape stays: roles, seqs, tool-call ids and names (the structure the window
        # needs); what was said, sent, asked of a tool or returned by it goes.
        with_calls = (
            await conn.execute(
                select(messages.c.id, messages.c.tool_calls).where(
                    history_ids, messages.c.tool_calls.is_not(None)
                )
            )
        ).all()
        receipt["messages"] = (
            await conn.execute(update(messages).where(history_ids).values(content=TOMBSTONE, parts=None))
        ).rowcount or 0
        for message_id, calls in with_calls:
            if not calls:  # a JSON null is not an SQL NULL
                continue
            await conn.execute(
                update(messages).where(messages.c.id == message_id).values(tool_calls=_emptied(calls))
            )
        for event in found.events:
            payload = dict(event["payload"])
            payload["parts"] = tomb_parts
            payload["metadata"] = {}
            await conn.execute(
                update(inbox).where(inbox.c.id == event["id"]).values(payload=payload, error=None)
            )
        receipt["events"] = len(found.events)
        receipt["dead_letters"] = sum(1 for e in found.events if e["status"] == "failed")
        keys = list(found.direct_keys) or [""]
        erased_replies = 0
        theirs = outbox.c.session_key.in_(keys) | outbox.c.run_id.in_(found.group_run_ids or [-1])
        for row in (await conn.execute(select(outbox.c.id, outbox.c.payload).where(theirs))).mappings():
            payload = {**dict(row["payload"]), "parts": tomb_parts}
            await conn.execute(
                update(outbox).where(outbox.c.id == row["id"]).values(payload=payload, last_error=None)
            )
            erased_replies += 1
        receipt["replies"] = erased_replies
        ids = found.direct_session_ids or [-1]
        receipt["run_traces"] = (
            await conn.execute(update(runs).where(runs.c.session_id.in_(ids)).values(error=None, details={}))
        ).rowcount or 0
        receipt["approvals"] = (
            await conn.execute(update(approvals).where(approvals.c.session_id.in_(ids)).values(arguments={}))
        ).rowcount or 0
        await conn.execute(update(sessions).where(sessions.c.id.in_(ids)).values(title=None, metadata={}))
        receipt["memory"] = (
            await conn.execute(delete(memories).where(_memory_of(owners, keys)))
        ).rowcount or 0
        receipt["identity_links"] = (
            await conn.execute(delete(identity_links).where(identity_links.c.identity.in_(owners)))
        ).rowcount or 0
        receipt["sender_records"] = (
            await conn.execute(delete(session_senders).where(session_senders.c.identity.in_(owners)))
        ).rowcount or 0
        access = 0
        for channel, sender in who.identities:
            access += (
                await conn.execute(
                    delete(access_entries).where(
                        access_entries.c.channel == channel,
                        access_entries.c.kind == "sender",
                        access_entries.c.subject == sender,
                    )
                )
            ).rowcount or 0
            access += (
                await conn.execute(
                    delete(access_pairings).where(
                        access_pairings.c.channel == channel, access_pairings.c.sender_id == sender
                    )
                )
            ).rowcount or 0
        receipt["access_records"] = access
    receipt["files"] = await asyncio.to_thread(_remove_files, workspace_root, found)
    return receipt


def _emptied(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool calls keep their ids and names (results are matched by id); arguments go."""
    return [
        {**call, "function": {**(call.get("function") or {}), "arguments": "{}"}}
        if isinstance(call, dict)
        else call
        for call in calls
    ]


def _remove_files(root: str | None, found: Footprint) -> int:
    if root is None:
        return 0
    base = Path(root)
    removed = 0
    for key in found.direct_keys:
        generations = base / session_dir(key, 1).parent
        if generations.is_dir():
            removed += sum(1 for p in generations.rglob("*") if p.is_file())
            shutil.rmtree(generations, ignore_errors=True)
    for relative in found.group_files:
        path = base / relative
        if path.is_file():
            path.unlink()
            removed += 1
    return removed


def _plain(row: Any) -> dict[str, Any]:
    return {k: _json(v) for k, v in dict(row).items()}


def _json(value: Any) -> Any:
    from datetime import datetime

    return value.isoformat() if isinstance(value, datetime) else value


async def export_session(engine: AsyncEngine, key: str) -> dict[str, Any]:
    """One session key: every generation with its messages and run traces."""
    async with engine.connect() as conn:
        generations = (
            (
                await conn.execute(
                    select(sessions).where(sessions.c.key == key).order_by(sessions.c.generation)
                )
            )
            .mappings()
            .all()
        )
        if not generations:
            raise UnknownPerson(f"no session with key {key!r}")
        out = []
        for session in generations:
            history = (
                await conn.execute(
                    select(messages).where(messages.c.session_id == session["id"]).order_by(messages.c.seq)
                )
            ).mappings()
            traces = (
                await conn.execute(select(runs).where(runs.c.session_id == session["id"]).order_by(runs.c.id))
            ).mappings()
            out.append(
                {
                    **_plain(session),
                    "messages": [_plain(m) for m in history],
                    "runs": [_plain(r) for r in traces],
                }
            )
    return {"key": key, "generations": out}
