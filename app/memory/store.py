"""Long-term memory rows: one table, three scopes, one entry per (scope, owner, key).

- `user`: owner is a person (`app.memory.identity`): what one human told the bot.
- `session`: owner is a session key, and the entry remembers the generation
  (`source_session_id`) it came from: summaries and notes of one conversation.
- `global`: owner is `""`: facts the operator gives every session.

User and session entries also carry a **namespace**, the serving agent's
`memory_namespace` (`""` by default): agents with different namespaces never read or
write each other's entries. Global facts have the default namespace and reach every agent.

Nothing here decides who may read what; `app.memory.recall` does, from the turn's
own session and sender only.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sqlalchemy import and_, delete, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.sql.elements import ColumnElement

from app.db.engine import autocommit
from app.db.models import memories, utcnow

GLOBAL_OWNER = ""
DEFAULT_NAMESPACE = ""
MAX_CONTENT_CHARS = 4000


class Scope(StrEnum):
    USER = "user"
    SESSION = "session"
    GLOBAL = "global"


@dataclass(frozen=True)
class Memory:
    id: int
    scope: Scope
    owner: str
    key: str | None
    content: str
    kind: str
    source_session_id: int | None
    updated_at: datetime
    metadata: dict[str, Any] = field(default_factory=dict)
    namespace: str = DEFAULT_NAMESPACE


@dataclass(frozen=True)
class OwnerFilter:
    """One scope's allowed owner (and, for session scope, the generation)."""

    scope: Scope
    owner: str
    session_id: int | None = None
    shareable_only: bool = False  # only entries their owner marked shareable
    namespace: str | None = None  # None: every namespace (operator tools)

    def clause(self) -> ColumnElement[bool]:
        parts = [memories.c.scope == self.scope.value, memories.c.owner == self.owner]
        if self.namespace is not None:
            parts.append(memories.c.namespace == self.namespace)
        if self.session_id is not None:
            parts.append(memories.c.source_session_id == self.session_id)
        if self.shareable_only:
            parts.append(memories.c.metadata["shareable"].as_boolean().is_(True))
        return and_(*parts)


def content_key(content: str, prefix: str = "note") -> str:
    """A stable key for an entry without a natural one: the same text is stored once."""
    normal = " ".join(content.lower().split())
    return f"{prefix}:{hashlib.sha256(normal.encode()).hexdigest()[:24]}"


def memory_from_row(row: Any) -> Memory:
    meta = dict(row["metadata"] or {})
    return Memory(
        id=row["id"],
        scope=Scope(row["scope"]),
        owner=row["owner"],
        key=row["key"],
        content=row["content"],
        kind=str(meta.get("kind", "note")),
        source_session_id=row["source_session_id"],
        updated_at=row["updated_at"],
        metadata=meta,
        namespace=row.get("namespace") or DEFAULT_NAMESPACE,
    )


async def put_memory(
    conn: AsyncConnection,
    scope: Scope,
    owner: str,
    content: str,
    *,
    key: str | None = None,
    kind: str = "note",
    source_session_id: int | None = None,
    metadata: dict[str, Any] | None = None,
    namespace: str = DEFAULT_NAMESPACE,
) -> None:
    """Insert or replace the entry (scope, owner, namespace, key) inside the caller's transaction."""
    content = content.strip()[:MAX_CONTENT_CHARS]
    if not content:
        raise ValueError("empty memory")
    now = utcnow()
    meta = {**(metadata or {}), "kind": kind}
    values = dict(
        scope=scope.value,
        owner=owner,
        key=key or content_key(content, kind),
        content=content,
        source_session_id=source_session_id,
        created_at=now,
        updated_at=now,
        metadata=meta,
        namespace=namespace,
    )
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    stmt = dialect.insert(memories).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["scope", "owner", "namespace", "key"],
        set_={
            "content": stmt.excluded.content,
            "source_session_id": stmt.excluded.source_session_id,
            "updated_at": stmt.excluded.updated_at,
            "metadata": stmt.excluded["metadata"],
        },
    )
    await conn.execute(stmt)


class MemoryStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine
        self.reader = autocommit(engine)

    async def put(self, scope: Scope, owner: str, content: str, **kw: Any) -> None:
        async with self.engine.begin() as conn:
            await put_memory(conn, scope, owner, content, **kw)

    async def entries(
        self,
        filters: Sequence[OwnerFilter],
        *,
        limit: int = 100,
        kind: str | None = None,
        conn: AsyncConnection | None = None,
    ) -> list[Memory]:
        """Entries of the given owners only, newest first."""
        if not filters:
            return []
        query = (
            select(memories)
            .where(or_(*(f.clause() for f in filters)))
            .order_by(memories.c.updated_at.desc(), memories.c.id.desc())
            .limit(limit)
        )
        if conn is not None:
            rows = (await conn.execute(query)).mappings().all()
        else:
            async with self.engine.connect() as own:
                rows = (await own.execute(query)).mappings().all()
        found = [memory_from_row(r) for r in rows]
        return [m for m in found if kind is None or m.kind == kind]

    async def run_recall(self, query: Any, params: dict[str, Any]) -> list[Memory]:
        """Run a prepared recall query (`app.memory.recall`) on an autocommit connection."""
        async with self.reader.connect() as conn:
            rows = (await conn.execute(query, params)).mappings().all()
        return [memory_from_row(r) for r in rows]

    async def search(
        self, filters: Sequence[OwnerFilter], query: str, *, limit: int = 10, scan: int = 500
    ) -> list[Memory]:
        """Entries of the given owners ranked by how many query words they contain."""
        candidates = await self.entries(filters, limit=scan)
        words = _words(query)
        if not words:
            return candidates[:limit]
        scored = [(sum(w in m.content.lower() for w in words), i, m) for i, m in enumerate(candidates)]
        hits = [(score, i, m) for score, i, m in scored if score > 0]
        hits.sort(key=lambda t: (-t[0], t[1]))
        return [m for _, _, m in hits[:limit]]

    async def delete(self, memory_id: int, *, scope: Scope | None = None) -> bool:
        query = delete(memories).where(memories.c.id == memory_id)
        if scope is not None:
            query = query.where(memories.c.scope == scope.value)
        async with self.engine.begin() as conn:
            result = await conn.execute(query)
        return bool(result.rowcount)

    async def sync_global_file(self, path: str | Path) -> int:
        """Make the file's facts the `global` entries that came from a file; returns their count."""
        text = await asyncio.to_thread(Path(path).read_text, encoding="utf-8")
        facts = list(_file_facts(text.splitlines()))
        keys = {content_key(f, "file"): f for f in facts}
        async with self.engine.begin() as conn:
            existing = (
                (
                    await conn.execute(
                        select(memories.c.id, memories.c.key).where(
                            memories.c.scope == Scope.GLOBAL.value,
                            memories.c.owner == GLOBAL_OWNER,
                            memories.c.key.like("file:%"),
                        )
                    )
                )
                .mappings()
                .all()
            )
            stale = [r["id"] for r in existing if r["key"] not in keys]
            if stale:
                await conn.execute(delete(memories).where(memories.c.id.in_(stale)))
            for key, fact in keys.items():
                await put_memory(
                    conn, Scope.GLOBAL, GLOBAL_OWNER, fact, key=key, kind="file", metadata={"path": str(path)}
                )
        return len(keys)


def _file_facts(lines: Iterable[str]) -> Iterable[str]:
    for line in lines:
        text = line.strip()
        if text.startswith("- "):
            text = text[2:].strip()
        if text and not text.startswith("#"):
            yield text


def _words(text: str) -> list[str]:
    """Lower-case search terms: words of 2+ letters, and single CJK characters."""
    out: list[str] = []
    word = ""
    for ch in text.lower():
        if "\u4e00" <= ch <= "\u9fff":
            if len(word) > 1:
                out.append(word)
            word = ""
            out.append(ch)
        elif ch.isalnum():
            word += ch
        else:
            if len(word) > 1:
                out.append(word)
            word = ""
    if len(word) > 1:
        out.append(word)
    return list(dict.fromkeys(out))
