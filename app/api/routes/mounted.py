"""Channels whose paths are fixed by their protocol, outside `/channels/`: the
OpenAI-compatible API (`/v1/…`) and the MCP server (`/mcp`).

Each path is mounted here and handed to the running adapter's `asgi`; without the channel
it answers 404 (in the protocol's error shape where it has one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

if TYPE_CHECKING:
    from fastapi import FastAPI

OPENAI_PATHS = {
    "/v1/models": ["GET"],
    "/v1/models/{model}": ["GET"],
    "/v1/chat/completions": ["POST"],
}
MCP_PATHS = {"/mcp": ["GET", "POST", "DELETE"]}


class _ToChannel:
    def __init__(self, app: FastAPI, channel: str, not_found: dict[str, Any]) -> None:
        self.app = app
        self.channel = channel
        self.not_found = not_found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adapter = self.app.state.runtime.adapters.get(self.channel)
        serve = getattr(adapter, "asgi", None)
        if serve is None:
            await JSONResponse(self.not_found, status_code=404)(scope, receive, send)
            return
        await serve(scope, receive, send)


def mount(app: FastAPI, channel: str, paths: Mapping[str, Sequence[str]], not_found: dict[str, Any]) -> None:
    target = _ToChannel(app, channel, not_found)
    for path, methods in paths.items():
        app.router.routes.append(Route(path, target, methods=list(methods), include_in_schema=False))


def install(app: FastAPI) -> None:
    error = {
        "message": "the OpenAI-compatible API is not enabled here (OPENAI_API_TOKENS)",
        "type": "invalid_request_error",
        "param": None,
        "code": "not_found",
    }
    mount(app, "openai", OPENAI_PATHS, {"error": error})
    mount(
        app,
        "mcp",
        MCP_PATHS,
        {"error": "not_found", "detail": "the MCP server is not enabled here (MCP_SERVER_TOKENS)"},
    )
