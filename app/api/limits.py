"""ASGI middlewares at the door of every route: a body limit, admin authentication before
the body is read, and requests no route can serve safely (NUL in the URL).

They run before FastAPI reads a body: FastAPI parses a route's body before it solves the
route's dependencies, so `require_admin` alone would let an anonymous client make the
server read, and parse, any body it sends.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

ADMIN_API = "/admin/api/"


async def _answer(send: Send, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"body is over the limit of {limit} bytes")


class BodyLimit:
    """One body limit for every route (`MAX_BODY_BYTES`): a declared Content-Length over it
    is answered 413 before anything is read; a body that grows over it while being read
    stops being read and the route answers 413 (raised from `receive`)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await _answer(send, 400, "Content-Length is not a number")
                    return
                if int(value) > self.limit:
                    await _answer(send, 413, f"body of {int(value)} bytes is over the limit of {self.limit}")
                    return
        size = 0

        async def counted() -> Message:
            nonlocal size
            message = await receive()
            if message["type"] == "http.request":
                size += len(message.get("body", b""))
                if size > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


class AdminAuthFirst:
    """`/admin/api/*` refuses unauthenticated requests (401, 429, 503) before the body is read."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(ADMIN_API):
            from app.api.deps import require_admin  # deps imports the runtime; keep this module light

            try:
                await require_admin(Request(scope))
            except HTTPException as exc:
                await _answer(send, exc.status_code, str(exc.detail), dict(exc.headers or {}))
                return
        await self.app(scope, receive, send)


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
                await _answer(send, 400, "NUL characters are not allowed in URLs")
            else:
                await send({"type": "websocket.close", "code": 1008, "reason": "NUL in URL"})
            return
        raw: Any = scope.get("raw_path")
        if scope["type"] == "http" and raw and scope["path"].startswith(ADMIN_API) and b"%2" in raw.upper():
            scope = {**scope, "path": _admin_path(raw.split(b"?", 1)[0])}
        await self.app(scope, receive, send)
