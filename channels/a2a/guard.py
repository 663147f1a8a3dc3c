"""Bad JSON-RPC input answered before the SDK sees it, with a generic message.

Text that no store can hold (a NUL, a lone surrogate) reached the SDK's protobuf parsing
or our storage and came back as `-32603` with a Python message. Here the body is read
once and screened: nested deeper than `MAX_DEPTH` → `-32600` (invalid request); such
characters anywhere in it → `-32602` (invalid params). Anything else, including a body
that is not JSON at all, goes on to the SDK unchanged (it answers `-32700` for that).
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Message, Receive, Scope

from app.events import unstorable_in

MAX_DEPTH = 32  # an A2A request is a handful of levels deep; metadata gets the rest

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602


def _depth(value: Any, limit: int) -> int:
    """How deep `value` nests, counted without recursion and no further than `limit` + 1."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > limit:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return deepest


def _error(request_id: Any, code: int, message: str) -> JSONResponse:
    rid = request_id if isinstance(request_id, (str, int)) and not isinstance(request_id, bool) else None
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}})


def screen(body: bytes) -> JSONResponse | None:
    """The error answer for a body that must not reach the SDK; None to pass it on."""
    try:
        data = json.loads(body)
    except RecursionError:
        return _error(None, INVALID_REQUEST, "Invalid request: nested too deeply")
    except (ValueError, UnicodeDecodeError):
        return None  # not JSON: the SDK's parse error (-32700)
    request_id = data.get("id") if isinstance(data, dict) else None
    if _depth(data, MAX_DEPTH) > MAX_DEPTH:
        return _error(request_id, INVALID_REQUEST, "Invalid request: nested too deeply")
    if unstorable_in(data):
        return _error(
            request_id, INVALID_PARAMS, "Invalid params: text contains a NUL character or a lone surrogate"
        )
    return None


async def read_body(receive: Receive, limit: int) -> bytes:
    """The request body, read no further than `limit` + 1 bytes (over: the caller refuses)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        chunks.append(chunk)
        size += len(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay(body: bytes, receive: Receive) -> Receive:
    """A `receive` that hands the already-read body to the next application, then the
    connection's own messages (a streaming answer waits on them for the disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def is_post(scope: Scope) -> bool:
    return str(scope.get("method", "")).upper() == "POST"
