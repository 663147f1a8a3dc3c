"""`/channels/{name}/…`: hands platform requests to their adapter."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast
from urllib.parse import parse_qsl

import structlog
from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import ValidationError
from starlette.types import Receive, Scope, Send

from app.api.deps import get_runtime
from app.channel import ChannelAdapter, ChannelRequest, ChannelResponse, HttpChannel, WebSocketChannel
from app.errors import ChannelRequestError, InvalidPayload, PayloadTooLarge, UnknownChannel

if TYPE_CHECKING:
    from app.runtime import Runtime

log = structlog.get_logger(__name__)
router = APIRouter(tags=["channels"])

# The methods platforms use on `/channels/...`; the app serves these without FastAPI's
# routing (see `serve_http`).
HTTP_METHODS = ("GET", "POST", "PUT")
PREFIX = "/channels/"

BodyReader = Callable[[int], Awaitable[bytes]]


class _Disconnected(Exception):
    """The client went away before its body was read: there is nobody to answer."""


def _http_channel(runtime: Runtime, name: str) -> tuple[ChannelAdapter, HttpChannel]:
    adapter = runtime.adapters.get(name)
    # `handle_request`, not isinstance: a runtime-checkable Protocol's isinstance costs
    # tens of microseconds, on every webhook.
    if adapter is None or not hasattr(adapter, "handle_request"):
        raise UnknownChannel(f"no channel {name!r} is enabled on this server")
    return adapter, cast(HttpChannel, adapter)


async def _handle(
    runtime: Runtime,
    name: str,
    subpath: str,
    read_body: BodyReader,
    make_request: Callable[[bytes], ChannelRequest],
) -> Response:
    """The adapter's answer, or the error response for a request it cannot take."""
    try:
        adapter, http = _http_channel(runtime, name)
        body = await read_body(min(adapter.settings.max_body_bytes, runtime.settings.max_body_bytes))
        try:
            return _to_response(await http.handle_request(make_request(body)))
        except ValidationError as exc:
            # An adapter built an event the event model refuses (`InboundEvent._storable`):
            # nothing was stored, the sender gets the reason.
            raise InvalidPayload(_validation_detail(exc)) from exc
        except RecursionError as exc:
            raise InvalidPayload("payload is nested too deeply") from exc
        except _SHAPE_ERRORS as exc:
            # A validly signed payload of a shape the adapter did not expect (a list where
            # the platform documents a string …): the sender's error, not ours. Logged with
            # its traceback, so the adapter can learn to refuse it by name.
            log.warning("channel_payload_unexpected_shape", channel=name, exc_info=True)
            raise InvalidPayload(f"payload has an unexpected shape ({type(exc).__name__}: {exc})") from exc
    except ChannelRequestError as exc:
        if not isinstance(exc, UnknownChannel):
            runtime.metrics.events_rejected.labels(name, exc.code).inc()
        return error_response(exc)


_SHAPE_ERRORS = (TypeError, KeyError, AttributeError, IndexError, ValueError)


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}" for e in exc.errors()[:5])


def error_response(exc: ChannelRequestError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.http_status)


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit}")


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body is over the limit of {limit} bytes")


async def _read_body(request: Request, limit: int) -> bytes:
    _check_declared(request.headers.get("content-length"), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _to_response(resp: ChannelResponse) -> Response:
    if isinstance(resp.body, (dict, list)):
        return JSONResponse(resp.body, status_code=resp.status, headers=resp.headers)
    body = resp.body.encode() if isinstance(resp.body, str) else (resp.body or b"")
    return Response(body, status_code=resp.status, media_type=resp.content_type, headers=resp.headers)


async def serve_http(runtime: Runtime, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve an HTTP request to `/channels/{name}[/{subpath}]` as a plain ASGI app.

    This is the hot path of every platform webhook. FastAPI's routing, dependency solving
    and middleware stack around it cost about a sixth of a loaded server's CPU, and the
    adapter needs none of them: it gets the method, path, headers, query and body, and
    answers with a `ChannelResponse`. Errors are answered as the FastAPI routes below
    answer them (`{"error", "detail"}` with the error's status). The routes stay for the
    OpenAPI document and for anything that calls the FastAPI app's router directly.
    """
    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    name, _, subpath = path[len(PREFIX) :].partition("/")
    raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}

    async def read_body(limit: int) -> bytes:
        _check_declared(headers.get("content-length"), limit)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def make_request(body: bytes) -> ChannelRequest:
        client = scope.get("client")
        return ChannelRequest(
            method=scope["method"],
            path=subpath,
            headers=headers,
            query=dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)),
            body=body,
            client=client[0] if client else None,
        )

    try:
        response = await _handle(runtime, name, subpath, read_body, make_request)
    except _Disconnected:
        return
    except Exception:
        # As Starlette's ServerErrorMiddleware: a plain 500, and the exception goes on to
        # the server, which logs it.
        await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
        raise
    await response(scope, receive, send)


async def channel_root(name: str, request: Request) -> Response:
    """A platform webhook: verified and parsed by the channel's adapter."""
    return await channel_request(name, request)


async def channel_request(name: str, request: Request, subpath: str = "") -> Response:
    """A platform webhook on a sub-path (e.g. `/channels/slack/events`)."""

    def make_request(body: bytes) -> ChannelRequest:
        return ChannelRequest(
            method=request.method,
            path=subpath,
            headers={k.lower(): v for k, v in request.headers.items()},
            query=dict(request.query_params),
            body=body,
            client=request.client.host if request.client else None,
        )

    return await _handle(
        get_runtime(request), name, subpath, lambda limit: _read_body(request, limit), make_request
    )


# One route per method, so each gets its own OpenAPI operation id.
for _method in HTTP_METHODS:
    router.add_api_route(
        "/channels/{name}", channel_root, methods=[_method], name=f"channel_{_method.lower()}"
    )
    router.add_api_route(
        "/channels/{name}/{subpath:path}",
        channel_request,
        methods=[_method],
        name=f"channel_path_{_method.lower()}",
    )


class _StarletteChannelSocket:
    def __init__(self, ws: WebSocket) -> None:
        self._ws = ws
        self.headers = {k.lower(): v for k, v in ws.headers.items()}
        self.query = dict(ws.query_params)

    async def accept(self) -> None:
        await self._ws.accept()

    async def receive_text(self) -> str:
        """The next frame as text; binary frames are decoded as UTF-8 (bridges send both)."""
        message = await self._ws.receive()
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
        if message.get("text") is not None:
            return str(message["text"])
        return bytes(message.get("bytes") or b"").decode("utf-8", errors="replace")

    async def send_text(self, data: str) -> None:
        await self._ws.send_text(data)

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self._ws.close(code, reason)


@router.websocket("/channels/{name}/{subpath:path}")
async def channel_websocket(websocket: WebSocket, name: str, subpath: str) -> None:
    runtime = websocket.app.state.runtime
    adapter = runtime.adapters.get(name)
    if adapter is None or not isinstance(adapter, WebSocketChannel):
        # Accept first so the client sees our close code, not a bare handshake refusal.
        await websocket.accept()
        await websocket.close(code=4404, reason=f"no WebSocket channel {name!r}")
        return
    await adapter.handle_websocket(subpath, _StarletteChannelSocket(websocket))
