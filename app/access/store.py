"""Allowlists and pairing codes in the database, editable while the service runs.

Entries are per channel: a `sender` entry lets that sender talk in direct chats and in the
groups the channel serves; a `chat` entry lets everyone in that group chat talk. Pairing:
an unknown direct sender gets one code (one row per channel and sender); the operator's
approval uses it up and adds the sender as an entry, in one transaction.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from sqlalchemy import and_, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db.models import access_entries as entries
from app.db.models import access_pairings as pairings
from app.db.models import utcnow
from app.db.upsert import insert_for
from app.events import unstorable_text

# `admin`: the sender is an admin in the channel's groups (`app.access.roles`).
Kind = Literal["sender", "chat", "admin"]
KINDS: tuple[Kind, ...] = ("sender", "chat", "admin")

# No 0/O, 1/I/L: a code is read out and typed by people.
_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
CODE_LENGTH = 8


class BadAccessInput(ValueError):
    """An entry or code that cannot be stored or looked up (the API answers 400)."""


def new_code() -> str:
    return "".join(secrets.choice(_ALPHABET) for _ in range(CODE_LENGTH))


def normalize_code(code: str) -> str:
    """Codes are compared without case, spaces or dashes (`abcd-efgh` is `ABCDEFGH`)."""
    return "".join(ch for ch in code.upper() if ch not in " -\t")


# Ids become log fields and must be storable: no control characters, no lone surrogates.
_BAD_ID = re.compile("[\x00-\x1f\x7f\ud800-\udfff]")


def _check_channel(channel: str | None) -> None:
    if channel is not None and (len(channel) > 64 or _BAD_ID.search(channel)):
        raise BadAccessInput("channel must be at most 64 characters, without control characters")


def _check(channel: str, kind: str, subject: str, note: str | None = None) -> None:
    if kind not in KINDS:
        raise BadAccessInput(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not channel or len(channel) > 64:
        raise BadAccessInput("channel must be 1 to 64 characters")
    if not subject or len(subject) > 256:
        raise BadAccessInput("the sender or chat id must be 1 to 256 characters")
    if _BAD_ID.search(channel + subject):
        raise BadAccessInput("ids may not contain control characters or lone surrogates")
    if note is not None and (len(note) > 200 or unstorable_text(note)):
        raise BadAccessInput("a note has at most 200 characters, without NUL or lone surrogates")


@dataclass(frozen=True)
class Approved:
    """A pairing code the operator approved: who is allowed from now on."""

    code: str
    channel: str
    sender_id: str
    chat_id: str


def _entry(row: Any) -> dict[str, Any]:
    return {
        "channel": row.channel,
        "kind": row.kind,
        "subject": row.subject,
        "note": row.note,
        "added_by": row.added_by,
        "created_at": row.created_at,
    }


class AccessStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    # --- allowlist entries ------------------------------------------------------------

    async def allowed(self, channel: str, sender_id: str, chat_id: str | None) -> bool:
        """Whether a stored entry lets `sender_id` talk (`chat_id`: the group chat, if any)."""
        wanted = and_(entries.c.kind == "sender", entries.c.subject == sender_id)
        if chat_id is not None:
            wanted = or_(wanted, and_(entries.c.kind == "chat", entries.c.subject == chat_id))
        async with self.engine.connect() as conn:
            found = await conn.execute(
                select(entries.c.id).where(entries.c.channel == channel, wanted).limit(1)
            )
            return found.first() is not None

    async def has(self, channel: str, kind: str, subject: str) -> bool:
        """Whether the entry (`kind`, `subject`) is stored for `channel`."""
        async with self.engine.connect() as conn:
            found = await conn.execute(
                select(entries.c.id)
                .where(entries.c.channel == channel, entries.c.kind == kind, entries.c.subject == subject)
                .limit(1)
            )
            return found.first() is not None

    async def add(
        self, channel: str, kind: str, subject: str, *, note: str | None = None, added_by: str | None = None
    ) -> bool:
        """Allow `subject`; False when it was allowed already (the entry is kept as it was)."""
        _check(channel, kind, subject, note)
        async with self.engine.begin() as conn:
            return await _add(conn, channel, kind, subject, note=note, added_by=added_by)

    async def remove(self, channel: str, kind: str, subject: str) -> bool:
        """Take `subject` off the stored list; False when it was not on it.

        A removed sender who messages again in a `pairing` channel gets a new code.
        """
        _check(channel, kind, subject)
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(entries).where(
                    entries.c.channel == channel, entries.c.kind == kind, entries.c.subject == subject
                )
            )
        return bool(gone.rowcount)

    async def entries(self, channel: str | None = None) -> list[dict[str, Any]]:
        _check_channel(channel)
        query = select(entries).order_by(entries.c.channel, entries.c.kind, entries.c.subject)
        if channel is not None:
            query = query.where(entries.c.channel == channel)
        async with self.engine.connect() as conn:
            return [_entry(r) for r in (await conn.execute(query)).all()]

    # --- pairing ----------------------------------------------------------------------

    async def request_code(
        self, channel: str, sender_id: str, chat_id: str, text: str, *, ttl: float, max_pending: int
    ) -> str | None:
        """A new code for an unknown sender, or None: one is pending already, or too many are.

        One row per (channel, sender): a pending code that has not expired is never
        replaced, so repeated messages mint nothing; two replicas racing mint one.
        """
        now = utcnow()
        for _ in range(3):  # a clash of random codes is retried with another one
            values = dict(
                channel=channel,
                sender_id=sender_id,
                chat_id=chat_id,
                code=new_code(),
                status="pending",
                created_at=now,
                expires_at=now + timedelta(seconds=ttl),
                approved_at=None,
                approved_by=None,
                text=text[:200],
            )
            try:
                async with self.engine.begin() as conn:
                    # Counted and minted in one transaction that holds the channel's lock, so
                    # the cap holds exactly however many newcomers arrive at once.
                    await _lock_pairings(conn, channel)
                    if await _pending(conn, channel, now) >= max_pending:
                        return None
                    stmt = insert_for(conn.dialect.name, pairings).values(**values)
                    stmt = stmt.on_conflict_do_update(
                        index_elements=["channel", "sender_id"],
                        set_={k: stmt.excluded[k] for k in values if k not in ("channel", "sender_id")},
                        # Only an approved (then removed) or expired request gets a new code.
                        where=or_(pairings.c.status != "pending", pairings.c.expires_at <= now),
                    ).returning(pairings.c.code)
                    minted = (await conn.execute(stmt)).scalar()
            except IntegrityError:
                continue
            return str(minted) if minted is not None else None
        return None

    async def approve(self, code: str, *, by: str) -> Approved | None:
        """Use up a pending, unexpired code and allow its sender; None if there is no such code."""
        code = normalize_code(code)
        if not code or len(code) > 16 or any(ch not in _ALPHABET for ch in code):
            return None  # nothing like a code we give out
        now = utcnow()
        async with self.engine.begin() as conn:
            row = (
                await conn.execute(
                    update(pairings)
                    .where(
                        pairings.c.code == code, pairings.c.status == "pending", pairings.c.expires_at > now
                    )
                    .values(status="approved", approved_at=now, approved_by=by[:256])
                    .returning(pairings.c.channel, pairings.c.sender_id, pairings.c.chat_id)
                )
            ).first()
            if row is None:
                return None
            await _add(conn, row.channel, "sender", row.sender_id, note=None, added_by=f"pairing:{by}"[:256])
        return Approved(code, row.channel, row.sender_id, row.chat_id)

    async def pending(self, channel: str | None = None) -> list[dict[str, Any]]:
        """Pairing requests waiting for the operator (unexpired), oldest first."""
        _check_channel(channel)
        query = (
            select(pairings)
            .where(pairings.c.status == "pending", pairings.c.expires_at > utcnow())
            .order_by(pairings.c.created_at, pairings.c.id)
        )
        if channel is not None:
            query = query.where(pairings.c.channel == channel)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [
            {
                "code": r.code,
                "channel": r.channel,
                "sender_id": r.sender_id,
                "chat_id": r.chat_id,
                "text": r.text,
                "created_at": r.created_at,
                "expires_at": r.expires_at,
            }
            for r in rows
        ]

    async def prune(self, older_than: datetime) -> int:
        """Forget pairing requests that expired before `older_than` without being approved."""
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(pairings).where(pairings.c.status == "pending", pairings.c.expires_at < older_than)
            )
        return int(gone.rowcount or 0)


async def _lock_pairings(conn: AsyncConnection, channel: str) -> None:
    """Take the channel's pairing lock for the rest of the transaction.

    PostgreSQL: a transaction-scoped advisory lock (every replica). SQLite: a write that
    changes nothing takes the database's one write lock now, not at the insert, so no
    other transaction counts between this one's count and its insert."""
    if conn.dialect.name == "postgresql":
        await conn.execute(select(func.pg_advisory_xact_lock(func.hashtext("chatgate.pairing:" + channel))))
    else:
        await conn.execute(
            update(pairings)
            .where(pairings.c.channel == channel, pairings.c.code == "")
            .values(status=pairings.c.status)
        )


async def _pending(conn: AsyncConnection, channel: str, now: datetime) -> int:
    found = await conn.execute(
        select(func.count())
        .select_from(pairings)
        .where(pairings.c.channel == channel, pairings.c.status == "pending", pairings.c.expires_at > now)
    )
    return int(found.scalar_one())


async def _add(
    conn: AsyncConnection, channel: str, kind: str, subject: str, *, note: str | None, added_by: str | None
) -> bool:
    stmt = insert_for(conn.dialect.name, entries).values(
        channel=channel,
        kind=kind,
        subject=subject,
        note=(note or None) and note[:200],
        added_by=added_by,
        created_at=utcnow(),
    )
    done = await conn.execute(stmt.on_conflict_do_nothing(index_elements=["channel", "kind", "subject"]))
    return bool(done.rowcount)
