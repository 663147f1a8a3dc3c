"""The app's own door: one pure ASGI middleware for every HTTP and WebSocket request.

In this order, as three middlewares did before (`OutageGuard`, `AdminAuthFirst`,
`BodyLimit`):

1. a database outage that escapes a request before its answer started becomes the 503
   with `Retry-After` (`app.api.outage`); anything else goes on to Starlette's 500;
2. `/admin/api/*` refuses unauthenticated requests (401, 429, 503) before the body is read;
3. one body limit (`MAX_BODY_BYTES`): a declared Content-Length over it is answered 413
   before anything is read, a body that grows over it stops being read and the route
   answers 413 (`BodyTooLarge`, raised from `receive`). Paths under `checked_by_route`
   (the platform webhooks) refuse a declared length themselves, against a limit never
   above this one (the channel's), in their own error shape and counted per channel; the
   body they read is counted here all the same.

They run before FastAPI reads a body: FastAPI parses a route's body before it solves the
route's dependencies, so `require_admin` alone would let an anonymous client make the
server read, and parse, any body it sends.

One middleware, not three: every request, each webhook too, holds its middlewares'
coroutines and wrappers for as long as it runs, and under load the extra objects were
paid for in garbage-collector passes (bench/RESULTS.md, "The mount's cost"). Here a
request holds one coroutine and one `_Passage`.
"""

from __future__ import annotations

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api import outage as outage_answers
from app.api.limits import ADMIN_API, BodyTooLarge, answer, route_path
from app.db.outage import Outage

# The messages after which an answer has started: no 503 can replace it any more.
_STARTS = frozenset(("http.response.start", "websocket.accept", "websocket.close"))


class _Passage:
    """One request's way through the door: whether its answer started, how much of its
    body was read. Its `send` and `receive` wrap the server's."""

    __slots__ = ("_receive", "_send", "limit", "size", "started")

    def __init__(self, receive: Receive, send: Send, limit: int) -> None:
        self._receive = receive
        self._send = send
        self.limit = limit
        self.size = 0
        self.started = False

    async def send(self, message: Message) -> None:
        if message["type"] in _STARTS:
            self.started = True
        await self._send(message)

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.size += len(message.get("body", b""))
            if self.size > self.limit:
                raise BodyTooLarge(self.limit)
        return message


class Door:
    """The outage 503, admin authentication first and the body limit (module docstring)."""

    def __init__(
        self, app: ASGIApp, *, outage: Outage, limit: int, checked_by_route: tuple[str, ...] = ()
    ) -> None:
        self.app = app
        self.outage = outage
        self.limit = limit
        self.checked_by_route = checked_by_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            await self.app(scope, receive, send)
            return
        passage = _Passage(receive, send, self.limit)
        try:
            if kind == "websocket":
                await self.app(scope, receive, passage.send)
            elif await self._admitted(scope, passage):
                await self.app(scope, passage.receive, passage.send)
        except Exception as exc:
            found = None if passage.started else outage_answers.answer(self.outage, exc)
            if found is None:
                raise
            await outage_answers.send_refusal(found, scope, receive, send)

    async def _admitted(self, scope: Scope, passage: _Passage) -> bool:
        """False when the request was answered here (unauthenticated admin call, a declared
        body over the limit); the answer went out through `passage`."""
        if scope["path"].startswith(ADMIN_API):
            from app.api.deps import require_admin  # deps imports the runtime; keep this module light

            try:
                await require_admin(Request(scope))
            except HTTPException as exc:
                await answer(passage.send, exc.status_code, str(exc.detail), dict(exc.headers or {}))
                return False
        if self.checked_by_route and route_path(scope).startswith(self.checked_by_route):
            return True
        for name, value in scope["headers"]:
            if name == b"content-length":
                if not value.isdigit():
                    await answer(passage.send, 400, "Content-Length is not a number")
                    return False
                if int(value) > self.limit:
                    over = f"body of {int(value)} bytes is over the limit of {self.limit}"
                    await answer(passage.send, 413, over)
                    return False
        return True
