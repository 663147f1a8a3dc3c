"""At the door of every route: requests no route can serve safely (NUL in the URL), and
what `app.api.door.Door` needs for the body limit and admin authentication."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from fastapi import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

ADMIN_API = "/admin/api/"


async def answer(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body is over the limit of {limit} bytes")


def route_path(scope: Scope) -> str:
    """The path without the `root_path` a proxy mounted the app under."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


_KEPT_ESCAPES = re.compile("(%2[Ff]|%25)")


def _admin_path(raw_path: bytes) -> str:
    """The path decoded except `%2F` and `%25`: a `/` inside a session key stays inside it.

    Servers decode `%2F` before routing, so `sessions/webhook%3Av%2Fmessages` (the key
    `webhook:v/messages`) would match the `/messages` route of `webhook:v`. Admin routes
    take keys with the `key` convertor, which decodes the two kept escapes.
    """
    pieces = _KEPT_ESCAPES.split(raw_path.decode("latin-1"))
    return "".join(p.upper() if i % 2 else unquote(p) for i, p in enumerate(pieces))


class UrlGuard:
    """Refuse NUL anywhere in the URL (no store or log wants it) and route admin keys whole."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        query: bytes = scope.get("query_string", b"")
        if "\x00" in scope["path"] or b"%00" in query or b"\x00" in query:
            if scope["type"] == "http":
                await answer(send, 400, "NUL characters are not allowed in URLs")
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": "NUL in URL"})
            return
        raw: Any = scope.get("raw_path")
        if scope["type"] == "http" and raw and scope["path"].startswith(ADMIN_API) and b"%2" in raw.upper():
            scope = {**scope, "path": _admin_path(raw.split(b"?", 1)[0])}
        await self.app(scope, receive, send)
