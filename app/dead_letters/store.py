"""Dead letters: events that failed after their attempts, replies that failed after their retries.

A dead letter is an inbox row or an outbox row in status `failed`. The operator lists
them (with error, session and time), and resolves each one of two ways:

- **retry**: the row goes back to `pending` with exactly one attempt left
  (`attempts = max - 1`), so the ordinary way takes it again — the scheduler under the
  session's fenced lease for an event, the outbox sender for a reply — and a second
  failure makes it a dead letter again. The update matches `status = 'failed'` only, so
  two operators retrying at once re-queue it once.
- **discard**: the row becomes `discarded`; nothing runs it, and retention may delete
  it later like a finished row.

Retention never deletes a `failed` row: an unresolved dead letter stays until someone
acts on it (`app.pipeline.retention`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import inbox, outbox, utcnow

Kind = Literal["inbox", "outbox"]
KINDS: tuple[Kind, ...] = ("inbox", "outbox")
FAILED = "failed"
DISCARDED = "discarded"
MAX_BATCH = 1000  # rows one retry/discard by filter touches; repeat for more


class BadDeadLetterId(ValueError):
    """An id that is not `inbox:<n>` or `outbox:<n>`."""


def parse_id(value: str) -> tuple[Kind, int]:
    kind, _, number = value.partition(":")
    if kind not in KINDS or not number.isdigit():
        raise BadDeadLetterId(f"dead letter ids look like inbox:12 or outbox:7, not {value!r}")
    return kind, int(number)  # type: ignore[return-value]


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters; every field narrows, none set means all of them."""

    kind: Kind | None = None
    ids: tuple[str, ...] = ()
    channel: str | None = None
    session_key: str | None = None
    error_contains: str | None = None
    failed_before: datetime | None = None
    failed_after: datetime | None = None

    def is_empty(self) -> bool:
        return self == DeadLetterFilter()


def _text(payload: Any) -> str:
    parts = (payload or {}).get("parts", []) if isinstance(payload, dict) else []
    return "\n".join(p.get("text", "") for p in parts if isinstance(p, dict) and p.get("type") == "text")


@dataclass(frozen=True)
class Resolved:
    id: str
    kind: Kind
    session_key: str


class _Table:
    """How one table's dead letters are found, shown and resolved."""

    def __init__(self, kind: Kind, table: Any, error: Any, failed_at: Any, max_attempts: int) -> None:
        self.kind = kind
        self.table = table
        self.error = error
        self.failed_at = failed_at
        self.max_attempts = max_attempts

    def where(self, f: DeadLetterFilter) -> list[Any] | None:
        """Conditions for the filter, or None when the filter excludes this table."""
        t = self.table
        if f.kind is not None and f.kind != self.kind:
            return None
        conds: list[Any] = [t.c.status == FAILED]
        if f.ids:
            own = [n for kind, n in map(parse_id, f.ids) if kind == self.kind]
            if not own:
                return None
            conds.append(t.c.id.in_(own))
        if f.channel:
            conds.append(t.c.channel == f.channel)
        if f.session_key:
            conds.append(t.c.session_key == f.session_key)
        if f.error_contains:
            conds.append(self.error.contains(f.error_contains, autoescape=True))
        if f.failed_before:
            conds.append(self.failed_at < f.failed_before)
        if f.failed_after:
            conds.append(self.failed_at >= f.failed_after)
        return conds

    def show(self, row: Any) -> dict[str, Any]:
        return {
            "id": f"{self.kind}:{row['id']}",
            "kind": self.kind,
            "channel": row["channel"],
            "session_key": row["session_key"],
            "event_id": row["event_id"],
            "error": row[self.error.name],
            "attempts": row["attempts"],
            "failed_at": row[self.failed_at.name],
            "created_at": row["created_at"],
            "text": _text(row["payload"])[:500],
        }

    def retried(self, now: datetime) -> dict[str, Any]:
        values: dict[str, Any] = {"status": "pending", "attempts": self.max_attempts - 1}
        if self.kind == "inbox":
            values["updated_at"] = now
        else:
            values.update(next_attempt_at=now, claimed_until=None)
        return values

    def discarded(self, now: datetime) -> dict[str, Any]:
        # Stamped with the time of the decision (shown as such; retention may delete it).
        return {"status": DISCARDED, self.failed_at.name: now}


class DeadLetters:
    def __init__(self, engine: AsyncEngine, *, event_attempts: int, delivery_attempts: int) -> None:
        self.engine = engine
        self.tables = (
            _Table("inbox", inbox, inbox.c.error, inbox.c.updated_at, max(1, event_attempts)),
            _Table(
                "outbox", outbox, outbox.c.last_error, outbox.c.next_attempt_at, max(1, delivery_attempts)
            ),
        )

    async def search(self, f: DeadLetterFilter | None = None, *, limit: int = 100) -> list[dict[str, Any]]:
        """Dead letters matching the filter, newest failure first."""
        f = f or DeadLetterFilter()
        found: list[dict[str, Any]] = []
        async with self.engine.connect() as conn:
            for t in self.tables:
                conds = t.where(f)
                if conds is None:
                    continue
                rows = await conn.execute(
                    select(t.table).where(*conds).order_by(t.failed_at.desc()).limit(limit)
                )
                found += [t.show(r) for r in rows.mappings()]
        found.sort(key=lambda d: d["failed_at"], reverse=True)
        return found[:limit]

    async def counts(self) -> dict[str, int]:
        """Unresolved dead letters per kind."""
        out: dict[str, int] = {}
        async with self.engine.connect() as conn:
            for t in self.tables:
                query = select(func.count()).select_from(t.table).where(t.table.c.status == FAILED)
                out[t.kind] = int((await conn.execute(query)).scalar_one())
        return out

    async def retry(self, f: DeadLetterFilter) -> list[Resolved]:
        """Re-queue the matching dead letters for one more attempt; returns those re-queued."""
        return await self._resolve(f, _Table.retried)

    async def discard(self, f: DeadLetterFilter) -> list[Resolved]:
        """Mark the matching dead letters discarded; returns those discarded."""
        return await self._resolve(f, _Table.discarded)

    async def _resolve(self, f: DeadLetterFilter, values: Any) -> list[Resolved]:
        done: list[Resolved] = []
        now = utcnow()
        async with self.engine.begin() as conn:
            for t in self.tables:
                conds = t.where(f)
                if conds is None:
                    continue
                ids = list(
                    (
                        await conn.execute(
                            select(t.table.c.id).where(*conds).order_by(t.table.c.id).limit(MAX_BATCH)
                        )
                    ).scalars()
                )
                if not ids:
                    continue
                # `status = 'failed'` again: a row resolved meanwhile by someone else is left alone.
                changed = await conn.execute(
                    update(t.table)
                    .where(t.table.c.id.in_(ids), t.table.c.status == FAILED)
                    .values(**values(t, now))
                    .returning(t.table.c.id, t.table.c.session_key)
                )
                done += [Resolved(f"{t.kind}:{n}", t.kind, key) for n, key in sorted(changed.all())]
        return done
