"""`/a2a` and `/.well-known/agent-card.json`: served by the A2A channel when it is enabled.

The paths are fixed by the A2A protocol, outside `/channels/`, so they are mounted here
and handed to the running adapter's ASGI app; without the channel they answer 404.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from fastapi import FastAPI

CHANNEL = "a2a"
PATHS = {
    "/a2a": ["POST"],
    "/.well-known/agent-card.json": ["GET", "HEAD"],
    # One agent of several (`AGENTS_FILE`): its JSON-RPC URL and its card.
    "/a2a/agents/{agent}": ["POST"],
    "/a2a/agents/{agent}/.well-known/agent-card.json": ["GET", "HEAD"],
}


class _ToChannel:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adapter = self.app.state.runtime.adapters.get(CHANNEL)
        serve = getattr(adapter, "asgi", None)
        if serve is None:
            response = JSONResponse(
                {"error": "not_found", "detail": "A2A is not enabled on this server (CHANNELS, A2A_TOKENS)"},
                status_code=404,
            )
            await response(scope, receive, send)
            return
        await serve(scope, receive, send)


def install(app: FastAPI) -> None:
    target = _ToChannel(app)
    for path, methods in PATHS.items():
        app.router.routes.append(Route(path, target, methods=methods, include_in_schema=False))
