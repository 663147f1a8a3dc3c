"""Routing of /channels/…: unknown channels get a clear answer over HTTP and WebSocket; the
mount inside the app's middleware stack hands adapters the request as sent and answers
errors as before (500 plain text, 413 `{error, detail}`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

from app.api.app import create_app
from app.channel import ChannelRequest, ChannelResponse, ChannelSettings
from tests.conftest import ServeApp, make_settings


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


async def test_webhooks_hand_the_adapter_the_request_as_sent(serve: ServeApp) -> None:
    """The mount hands the adapter the method, sub-path, headers, query (last value wins,
    blanks kept), body and client address; the adapter's answer goes out as it gave it."""
    echo = _EchoChannel()
    async with serve() as srv:
        srv.runtime.adapters["echo"] = echo
        async with httpx.AsyncClient(timeout=10) as client:
            resp = await client.post(
                f"{srv.url}/channels/echo/some/sub",
                content=b'{"a": 1}',
                params=[("q", "1"), ("q", "2"), ("blank", "")],
                headers={"Content-Type": "application/json", "X-Custom": "Yes"},
            )
            text = await client.put(f"{srv.url}/channels/echo/text")
            root = await client.get(f"{srv.url}/channels/echo")
            head = await client.head(f"{srv.url}/channels/echo/h")
            delete = await client.delete(f"{srv.url}/channels/echo/x")
    assert resp.status_code == 200 and resp.json() == {"path": "some/sub", "method": "POST"}
    assert resp.headers["content-type"] == "application/json"
    assert (text.status_code, text.text, text.headers["x-echo"]) == (201, "plain", "1")
    assert text.headers["content-type"] == "text/plain; charset=utf-8"
    assert root.json() == {"path": "", "method": "GET"}
    assert head.status_code == 200
    # Methods no platform uses are refused as any route refuses them.
    assert delete.status_code == 405 and delete.json() == {"detail": "Method Not Allowed"}
    assert "POST" in delete.headers["allow"]
    seen = echo.seen[0]
    assert (seen.method, seen.path, seen.body) == ("POST", "some/sub", b'{"a": 1}')
    assert seen.query == {"q": "2", "blank": ""}
    assert seen.headers["x-custom"] == "Yes" and seen.headers["content-type"] == "application/json"
    assert seen.client == "127.0.0.1"
    assert [(r.method, r.path) for r in echo.seen[1:]] == [("PUT", "text"), ("GET", ""), ("HEAD", "h")]


async def test_webhooks_go_through_the_apps_middleware_stack(db_url: str) -> None:
    """The mount is a route like the others: a middleware added to the app sees webhooks
    (before the mount, `ChatgateApp` answered them ahead of the stack)."""
    app = create_app(make_settings(db_url), channel_settings={})
    echo = _EchoChannel()
    app.state.runtime.adapters["echo"] = echo
    seen: list[str] = []

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                seen.append(scope["path"])
            await self.inner(scope, receive, send)

    app.add_middleware(Recording)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 1234))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        resp = await client.post("/channels/echo/sub", content=b"{}")
        other = await client.get("/no-such-page")
    assert resp.status_code == 200 and other.status_code == 404
    assert seen == ["/channels/echo/sub", "/no-such-page"]
    assert [r.path for r in echo.seen] == ["sub"]


async def test_the_openapi_document_lists_the_webhook_operations(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=10) as client:
        schema = (await client.get(f"{srv.url}/openapi.json")).json()
    operations = {
        (path, method): op["operationId"]
        for path, item in schema["paths"].items()
        if path.startswith("/channels/{name}")
        for method, op in item.items()
    }
    assert operations == {
        ("/channels/{name}", "get"): "channel_get_channels__name__get",
        ("/channels/{name}", "post"): "channel_post_channels__name__post",
        ("/channels/{name}", "put"): "channel_put_channels__name__put",
        ("/channels/{name}/{subpath}", "get"): "channel_path_get_channels__name___subpath__get",
        ("/channels/{name}/{subpath}", "post"): "channel_path_post_channels__name___subpath__post",
        ("/channels/{name}/{subpath}", "put"): "channel_path_put_channels__name___subpath__put",
    }


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


async def test_a_root_path_is_honoured(serve: ServeApp) -> None:
    """Behind a proxy that mounts the app under a prefix (ASGI `root_path`)."""
    echo = _EchoChannel()
    async with serve() as srv:
        srv.runtime.adapters["echo"] = echo
        transport = httpx.ASGITransport(app=srv.app, root_path="/api")
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            answers = [
                await client.post("/api/channels/echo/sub", content=b"{}"),
                await client.post("/channels/echo/sub", content=b"{}"),
                # The channel's own limit (64 bytes), in its shape, under the prefix too.
                await client.post("/api/channels/echo/sub", content=b"x" * 65),
            ]
    assert [(a.status_code, a.json()) for a in answers[:2]] == [(200, {"path": "sub", "method": "POST"})] * 2
    assert answers[2].status_code == 413
    assert answers[2].json() == {
        "error": "payload_too_large",
        "detail": "body of 65 bytes is over the limit of 64",
    }
    assert [r.path for r in echo.seen] == ["sub", "sub"]


async def test_the_apps_body_limit_is_answered_in_the_channels_shape(serve: ServeApp) -> None:
    """Under `MAX_BODY_BYTES` smaller than the channel's own limit, the app's limit holds
    for webhooks (declared or counted while read), answered `{error, detail}` and counted
    per channel as before the mount; other routes keep their `{detail}`."""
    echo = _EchoChannel()
    echo.settings = ChannelSettings(max_body_bytes=1000)

    async def chunks() -> AsyncIterator[bytes]:
        yield b"x" * 40
        yield b"y" * 40

    async with serve(max_body_bytes=50) as srv:
        srv.runtime.adapters["echo"] = echo
        async with httpx.AsyncClient(timeout=10) as client:
            declared = await client.post(f"{srv.url}/channels/echo/ok", content=b"x" * 60)
            streamed = await client.post(f"{srv.url}/channels/echo/ok", content=chunks())
            admin = await client.post(f"{srv.url}/admin/login", content=b"x" * 60)
            fine = await client.post(f"{srv.url}/channels/echo/ok", content=b"x" * 50)
        rejected = srv.runtime.metrics.registry.get_sample_value(
            "chatgate_events_rejected_total", {"channel": "echo", "reason": "payload_too_large"}
        )
    assert (declared.status_code, declared.json()) == (
        413,
        {"error": "payload_too_large", "detail": "body of 60 bytes is over the limit of 50"},
    )
    assert (streamed.status_code, streamed.json()) == (
        413,
        {"error": "payload_too_large", "detail": "body is over the limit of 50 bytes"},
    )
    assert (admin.status_code, admin.json()) == (413, {"detail": "body of 60 bytes is over the limit of 50"})
    assert fine.status_code == 200 and [r.path for r in echo.seen] == ["ok"]
    assert rejected == 2


class _OverflowingChannel(_EchoChannel):
    """An HTTP channel whose request handling overflows (e.g. a number too large to store)."""

    async def handle_request(self, request: ChannelRequest) -> ChannelResponse:
        self.seen.append(request)
        raise OverflowError("Python int too large to convert to C long")


async def test_the_apps_exception_handlers_answer_for_webhooks(serve: ServeApp) -> None:
    """An error the app has a handler for (`app.api.responses`) is answered by that handler
    for a webhook as for any route: a 400 with its reason, not Starlette's 500."""
    overflowing = _OverflowingChannel()
    async with serve() as srv:
        srv.runtime.adapters["overflowing"] = overflowing
        async with httpx.AsyncClient(timeout=10) as client:
            refused = await client.post(f"{srv.url}/channels/overflowing/in", content=b"{}")
            ready = await client.get(f"{srv.url}/readyz")
    assert refused.status_code == 400
    assert refused.json() == {"detail": "a value cannot be stored: OverflowError"}
    assert [r.path for r in overflowing.seen] == ["in"]
    assert ready.status_code == 200
