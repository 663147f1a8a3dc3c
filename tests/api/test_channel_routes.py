"""Routing of /channels/…: unknown channels get a clear answer over HTTP and WebSocket, and
the app's own HTTP path for webhooks hands adapters what FastAPI's routes would."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from fastapi import FastAPI
from websockets.exceptions import ConnectionClosed

from app.channel import ChannelRequest, ChannelResponse, ChannelSettings
from tests.conftest import ServeApp


async def test_unknown_channel_http_and_websocket(serve: ServeApp) -> None:
    async with serve() as srv:
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(f"{srv.url}/channels/nope/events", json={})
        assert resp.status_code == 404
        assert resp.json()["error"] == "unknown_channel"
        ws_url = srv.url.replace("http://", "ws://") + "/channels/nope/ws"
        async with websockets.connect(ws_url) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                await ws.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4404


class _EchoChannel:
    """An HTTP channel that answers with what it was handed (and fails on `/boom`)."""

    name = "echo"

    def __init__(self) -> None:
        self.settings = ChannelSettings(max_body_bytes=64)
        self.seen: list[ChannelRequest] = []

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        if request.path == "boom":
            raise RuntimeError("the adapter broke")
        self.seen.append(request)
        if request.path == "text":
            return ChannelResponse(
                status=201, body="plain", content_type="text/plain", headers={"x-echo": "1"}
            )
        return ChannelResponse.json({"path": request.path, "method": request.method})


async def test_webhooks_skip_fastapi_routing_and_hand_the_adapter_the_same_request(serve: ServeApp) -> None:
    """The app serves `/channels/...` before FastAPI's routing; the routes stay as they were.

    The same request through both paths reaches the adapter as the same `ChannelRequest`
    (apart from the client address) and gets the same answer.
    """
    echo = _EchoChannel()
    async with serve() as srv:
        srv.runtime.adapters["echo"] = echo
        request = dict(
            content=b'{"a": 1}',
            params=[("q", "1"), ("q", "2"), ("blank", "")],
            headers={"Content-Type": "application/json", "X-Custom": "Yes"},
        )
        async with httpx.AsyncClient(timeout=10) as client:
            fast = await client.post(f"{srv.url}/channels/echo/some/sub", **request)  # type: ignore[arg-type]
            text = await client.put(f"{srv.url}/channels/echo/text")

        async def through_fastapi(scope: Any, receive: Any, send: Any) -> None:
            await FastAPI.__call__(srv.app, scope, receive, send)

        transport = httpx.ASGITransport(app=through_fastapi, client=("127.0.0.1", 1234))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            routed = await client.post("/channels/echo/some/sub", **request)  # type: ignore[arg-type]
            routed_text = await client.put("/channels/echo/text")

    assert fast.status_code == routed.status_code == 200
    assert fast.json() == routed.json() == {"path": "some/sub", "method": "POST"}
    assert fast.headers["content-type"] == routed.headers["content-type"] == "application/json"
    assert (text.status_code, text.text, text.headers["x-echo"]) == (201, "plain", "1")
    assert text.headers["content-type"] == routed_text.headers["content-type"] == "text/plain; charset=utf-8"
    by_fast, by_routes = echo.seen[0], echo.seen[2]
    assert by_fast.query == by_routes.query == {"q": "2", "blank": ""}
    assert by_fast.body == by_routes.body == b'{"a": 1}'
    assert by_fast.headers["x-custom"] == "Yes"
    assert {k: v for k, v in by_fast.headers.items() if k not in ("host", "user-agent")} == {
        k: v for k, v in by_routes.headers.items() if k not in ("host", "user-agent")
    }
    assert by_fast.client == "127.0.0.1"


async def test_a_failing_adapter_gets_a_500_and_the_server_keeps_serving(serve: ServeApp) -> None:
    echo = _EchoChannel()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 40
        yield b"y" * 40

    async with serve() as srv:
        srv.runtime.adapters["echo"] = echo
        async with httpx.AsyncClient(timeout=10) as client:
            broken = await client.post(f"{srv.url}/channels/echo/boom", content=b"x")
            too_large = await client.post(f"{srv.url}/channels/echo/ok", content=chunks())
            fine = await client.post(f"{srv.url}/channels/echo/ok", content=b"x")
    assert (broken.status_code, broken.text) == (500, "Internal Server Error")
    # A chunked body (no content-length) is counted as it arrives.
    assert too_large.status_code == 413 and too_large.json()["error"] == "payload_too_large"
    assert fine.status_code == 200 and [r.path for r in echo.seen] == ["ok"]


async def test_a_root_path_is_honoured_as_fastapi_honours_it(serve: ServeApp) -> None:
    """Behind a proxy that mounts the app under a prefix (ASGI `root_path`)."""
    echo = _EchoChannel()
    async with serve() as srv:
        srv.runtime.adapters["echo"] = echo

        async def through_fastapi(scope: Any, receive: Any, send: Any) -> None:
            await FastAPI.__call__(srv.app, scope, receive, send)

        answers = []
        for app in (srv.app, through_fastapi):
            transport = httpx.ASGITransport(app=app, root_path="/api")
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                answers.append(await client.post("/api/channels/echo/sub", content=b"{}"))
    assert [(a.status_code, a.json()) for a in answers] == [(200, {"path": "sub", "method": "POST"})] * 2
    assert [r.path for r in echo.seen] == ["sub", "sub"]
