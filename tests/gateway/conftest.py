"""Gateway fixtures: the app served with the browser channel, and a small WS client."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from channels.browser import BrowserSettings
from tests.conftest import ServeApp, webhook_settings
from tests.support.servers import RunningApp
from tests.support.timing import scaled

ALICE_TOKEN = "alice-static-token-0123456789"
BOB_TOKEN = "bob-static-token-0123456789"
TOKEN_SECRET = "gateway-test-secret"

STATIC_TOKENS = [
    {"token": ALICE_TOKEN, "subject": "alice", "session_keys": ["web:alice"], "key_prefix": "web:alice:"},
    {"token": BOB_TOKEN, "subject": "bob", "session_keys": ["web:bob"]},
]


def browser_settings(**overrides: Any) -> BrowserSettings:
    return BrowserSettings(_env_file=None, **overrides)  # type: ignore[call-arg]


GatewayServe = Callable[..., AbstractAsyncContextManager[RunningApp]]


@pytest.fixture
def gateway_serve(serve: ServeApp) -> GatewayServe:
    """`async with gateway_serve(**settings) as srv:` the app with the browser channel on."""

    def _serve(
        *, browser: BrowserSettings | None = None, **overrides: Any
    ) -> AbstractAsyncContextManager[RunningApp]:
        values: dict[str, Any] = dict(
            gateway_tokens=STATIC_TOKENS,
            gateway_token_secret=TOKEN_SECRET,
            gateway_heartbeat_seconds=30,
        )
        values.update(overrides)
        channel_settings = {"webhook": webhook_settings(), "browser": browser or browser_settings()}
        return serve(channel_settings=channel_settings, **values)

    return _serve


def ws_url(base: str) -> str:
    return base.replace("http://", "ws://", 1) + "/ws"


class GatewayClient:
    """A real WebSocket client speaking the gateway protocol, with frame helpers."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.frames: list[dict[str, Any]] = []

    async def send(self, frame: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(frame))

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        frame = json.loads(await asyncio.wait_for(self.ws.recv(), timeout))
        self.frames.append(frame)
        return frame

    async def expect(self, type_: str, timeout: float = 10.0, **match: Any) -> dict[str, Any]:
        """The next frame of `type_` whose fields equal `match` (others are kept in `frames`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + scaled(timeout)
        while True:
            frame = await self.recv(max(0.01, deadline - loop.time()))
            if frame.get("type") == type_ and all(frame.get(k) == v for k, v in match.items()):
                return frame

    async def auth(self, token: str) -> dict[str, Any]:
        await self.send({"type": "auth", "token": token})
        return await self.expect("authenticated")

    async def attach(self, key: str | None = None, **extra: Any) -> dict[str, Any]:
        frame: dict[str, Any] = {"type": "attach", **extra}
        if key is not None:
            frame["session_key"] = key
        await self.send(frame)
        return await self.expect("ready")

    async def messages_until_answer(self, timeout: float = 15.0) -> list[dict[str, Any]]:
        """`message` frames up to and including the next final assistant answer."""
        out = []
        while True:
            frame = await self.expect("message", timeout)
            out.append(frame)
            if frame["role"] == "assistant" and not frame.get("tool_calls"):
                return out

    async def closed_with(self, timeout: float = 10.0) -> int | None:
        """Read until the server closes; the close code it sent."""
        try:
            while True:
                await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            return exc.rcvd.code if exc.rcvd else None


def small_buffer_socket(host: str, port: int, rcvbuf: int = 32_768) -> socket.socket:
    """A connected socket with a small, fixed receive buffer (no autotuning): a client
    that stops reading then backs up quickly, as a slow phone on a bad network does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect((host, port))
    return sock


@asynccontextmanager
async def gateway_client(
    base_url: str, token: str | None = None, *, slow: bool = False, **connect_kw: Any
) -> AsyncIterator[GatewayClient]:
    if slow:
        host, port = base_url.removeprefix("http://").split(":")
        connect_kw.update(sock=small_buffer_socket(host, int(port)), max_queue=1)
    else:
        # Tests read only the frames they look at; buffer the rest instead of pausing the
        # socket (a paused client would only see our close after its close timeout).
        connect_kw.setdefault("max_queue", None)
    async with connect(ws_url(base_url), open_timeout=10, **connect_kw) as ws:
        client = GatewayClient(ws)
        if token is not None:
            await client.auth(token)
        yield client
