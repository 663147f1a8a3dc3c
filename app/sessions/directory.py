"""Sessions as an API caller may see them (the MCP server): listed, read and written to
only where the caller's grant allows.

A grant (`app.gateway.tokens.GatewayGrant`, the browser gateway's kind) names exact
session keys and a key prefix matched by whole components. Every method takes the grant
and checks it before it reads or writes anything; a key the grant does not cover is as
unknown as a missing one. A message sent to a chat goes through the outbox like every
reply (the sender delivers it with its retries), once per message id.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol, runtime_checkable

from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import outbox
from app.db.upsert import insert_ignore
from app.events import OutboundMessage, TextPart, build_session_key
from app.gateway.tokens import GatewayGrant
from app.outbox_rows import outbox_values
from app.sessions import queries


@runtime_checkable
class UsesSessionDirectory(Protocol):
    """An adapter that reads sessions for its callers (the MCP server)."""

    def use_session_directory(self, directory: SessionDirectory) -> None: ...


class NotAllowed(Exception):
    """The grant does not cover the session or chat (or it does not exist)."""


class SessionDirectory:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        channels: Callable[[], Collection[str]],
        on_outbox: Callable[[], None] | None = None,
    ) -> None:
        self.engine = engine
        self.channels = channels  # the channels this gateway runs (messages go only there)
        self.on_outbox = on_outbox or (lambda: None)

    async def list_sessions(
        self, grants: Sequence[GatewayGrant], *, prefix: str = "", limit: int = 50
    ) -> list[dict[str, Any]]:
        """The granted sessions under `prefix`, most recently active first."""
        found: dict[str, dict[str, Any]] = {}
        for grant in grants:
            for key in grant.session_keys:
                if key.startswith(prefix):
                    for row in await queries.list_sessions(self.engine, key=key, limit=1):
                        found.setdefault(row["key"], row)
            narrow = _narrower(prefix, grant.key_prefix)
            if narrow is None:
                continue
            for row in await queries.list_sessions(self.engine, key_prefix=narrow, limit=limit * 4):
                if grant.allows(row["key"]):  # whole components, not the query's text prefix
                    found.setdefault(row["key"], row)
        rows = sorted(found.values(), key=lambda r: r["last_active_at"], reverse=True)[:limit]
        return [
            {
                "key": r["key"],
                "channel": r["channel"],
                "status": r["status"],
                "message_count": r["message_count"],
                "title": r["title"],
                "last_active_at": r["last_active_at"].isoformat(),
            }
            for r in rows
        ]

    async def history(
        self, grants: Sequence[GatewayGrant], key: str, *, limit: int = 50
    ) -> list[dict[str, Any]]:
        """The last `limit` messages of the key's current generation, in order."""
        if not _allowed(grants, key):
            raise NotAllowed(key)
        current = await queries.current_session(self.engine, key)
        if current is None:
            raise NotAllowed(key)
        after = max(0, int(current["message_count"]) - limit)
        rows = await queries.session_messages(self.engine, current["id"], after_seq=after, limit=limit)
        return [
            {
                "seq": r["seq"],
                "role": r["role"],
                "content": r["content"],
                "name": r["name"],
                "tool_calls": [c.get("function", {}).get("name") for c in r["tool_calls"] or []] or None,
                "created_at": r["created_at"].isoformat(),
            }
            for r in rows
        ]

    async def send(
        self, grants: Sequence[GatewayGrant], channel: str, chat_id: str, text: str, *, message_id: str
    ) -> OutboundMessage:
        """Queue `text` to the chat (its `chat`-scope key must be granted); once per id."""
        key = build_session_key(channel, chat_id)
        if channel not in self.channels() or not _allowed(grants, key):
            raise NotAllowed(key)
        message = OutboundMessage(
            message_id=message_id,
            channel=channel,
            chat_id=chat_id,
            parts=(TextPart(text=text),),
            session_key=key,
        )
        row = outbox_values(message, session_id=None, run_id=None, event_id=None)
        async with self.engine.begin() as conn:
            await conn.execute(insert_ignore(conn, outbox, ["message_id"]), [row])
        self.on_outbox()
        return message


def _allowed(grants: Sequence[GatewayGrant], key: str) -> bool:
    return any(g.allows(key) for g in grants)


def _narrower(prefix: str, granted: str | None) -> str | None:
    """The text prefix both `prefix` and the grant's prefix admit (None: none)."""
    if granted is None:
        return None
    if prefix.startswith(granted):
        return prefix
    if granted.startswith(prefix):
        return granted
    return None
