"""`/channels/{name}/…`: hands platform requests to their adapter.

`ChannelsApp` is mounted at `/channels` as the first route of the app, inside its one
middleware stack; HTTP and WebSocket requests alike reach it there."""

from __future__ import annotations

import re
import weakref
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl

import structlog
from fastapi import Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.routing import Mount
from starlette.types import Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.api.limits import BodyTooLarge
from app.channel import ChannelAdapter, ChannelRequest, ChannelResponse, HttpChannel, WebSocketChannel
from app.errors import ChannelAuthError, ChannelRequestError, InvalidPayload, PayloadTooLarge, UnknownChannel
from app.log_throttle import LogThrottle

if TYPE_CHECKING:
    from app.runtime import Runtime

log = structlog.get_logger(__name__)

# The methods platforms use on `/channels/...` (the OpenAPI document lists these).
HTTP_METHODS = ("GET", "POST", "PUT")
PREFIX = "/channels"


class _Disconnected(Exception):
    """The client went away before its body was read: there is nobody to answer."""


def _http_channel(runtime: Runtime, name: str) -> tuple[ChannelAdapter, HttpChannel]:
    adapter = runtime.adapters.get(name)
    # `handle_request`, not isinstance: a runtime-checkable Protocol's isinstance costs
    # tens of microseconds, on every webhook.
    if adapter is None or not hasattr(adapter, "handle_request"):
        raise UnknownChannel(f"no channel {name!r} is enabled on this server")
    return adapter, cast(HttpChannel, adapter)


class _Incoming:
    """One webhook request as its adapter gets it: the body read (under a limit) and the
    `ChannelRequest` built from the ASGI scope. One object, not two closures: a request
    holds it for as long as its adapter runs."""

    __slots__ = ("headers", "receive", "scope", "subpath")

    def __init__(self, scope: Scope, receive: Receive, subpath: str) -> None:
        self.scope = scope
        self.receive = receive
        self.subpath = subpath
        raw_headers: list[tuple[bytes, bytes]] = scope["headers"]
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in raw_headers}

    async def read_body(self, limit: int) -> bytes:
        _check_declared(self.headers.get("content-length"), limit)
        chunks, size = [], 0
        while True:
            try:
                message = await self.receive()
            except BodyTooLarge as exc:  # the app's limit (`app.api.door.Door`), met while reading
                raise _too_large(limit) from exc
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def request(self, body: bytes) -> ChannelRequest:
        scope = self.scope
        client = scope.get("client")
        return ChannelRequest(
            method=scope["method"],
            path=self.subpath,
            headers=self.headers,
            query=dict(parse_qsl(scope["query_string"].decode("latin-1"), keep_blank_values=True)),
            body=body,
            client=client[0] if client else None,
        )


async def _handle(runtime: Runtime, name: str, incoming: _Incoming) -> Response:
    """The adapter's answer, or the error response for a request it cannot take."""
    if runtime.handover.stopping:  # SIGTERM: nothing new is taken here (`app.shutdown`)
        return stopping_response(runtime.handover.retry_after)
    try:
        adapter, http = _http_channel(runtime, name)
        body = await incoming.read_body(min(adapter.settings.max_body_bytes, runtime.settings.max_body_bytes))
        try:
            return _to_response(await http.handle_request(incoming.request(body)))
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
        if isinstance(exc, ChannelAuthError):
            _log_refusal(runtime, name, exc)
        return error_response(exc)


# Per runtime and channel, one line a minute: a platform configured with a wrong secret
# retries for ever.
_AUTH_REFUSALS: weakref.WeakKeyDictionary[Runtime, LogThrottle] = weakref.WeakKeyDictionary()


def _log_refusal(runtime: Runtime, channel: str, exc: ChannelAuthError) -> None:
    throttle = _AUTH_REFUSALS.setdefault(runtime, LogThrottle(60.0))
    held = throttle.due(channel)
    if held is not None:
        # `detail` names what did not match, never the secret or what was sent instead.
        log.warning("channel_request_unauthorized", channel=channel, reason=exc.detail, since_last_line=held)


_SHAPE_ERRORS = (TypeError, KeyError, AttributeError, IndexError, ValueError)


def _validation_detail(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'event'}: {e['msg']}" for e in exc.errors()[:5])


def stopping_response(retry_after: int) -> JSONResponse:
    """503 of a replica that is handing its work over: nothing was stored, retry (elsewhere)."""
    return JSONResponse(
        {"error": "stopping", "detail": "this replica is stopping; retry the same request"},
        status_code=503,
        headers={"Retry-After": str(retry_after)},
    )


def error_response(exc: ChannelRequestError) -> JSONResponse:
    return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.http_status)


def _check_declared(declared: str | None, limit: int) -> None:
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit}")


def _too_large(limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(f"body is over the limit of {limit} bytes")


def _to_response(resp: ChannelResponse) -> Response:
    if isinstance(resp.body, (dict, list)):
        return JSONResponse(resp.body, status_code=resp.status, headers=resp.headers)
    body = resp.body.encode() if isinstance(resp.body, str) else (resp.body or b"")
    return Response(body, status_code=resp.status, media_type=resp.content_type, headers=resp.headers)


class ChannelsApp:
    """`/channels/{name}[/{subpath}]` as a plain ASGI app, mounted inside the app's one
    middleware stack (`app.api.app`): the URL guard, tracing, the database outage 503,
    the body limit, the exception handlers and Starlette's 500 apply here as on every route.

    This is the hot path of every platform webhook. FastAPI's dependency solving and
    request models around it cost a noticeable share of a loaded server's CPU, and the
    adapter needs none of them: it gets the method, path, headers, query and body, and
    answers with a `ChannelResponse`. The mount is the first route, so matching it is one
    regular expression. The OpenAPI operations come from `HTTP_METHODS` (`openapi_paths`).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # `path` is still the whole path; the mount keeps the app's own root path (a proxy's
        # prefix, if the server left it in the path) as `app_root_path`.
        path: str = scope["path"]
        root: str = scope.get("app_root_path", "")
        if root and path.startswith(root + "/"):
            path = path[len(root) :]
        name, slash, subpath = path[len(PREFIX) + 1 :].partition("/")
        if scope["type"] == "websocket":
            if not slash:  # as before the mount: a WebSocket needs `/channels/{name}/{subpath}`
                await WebSocketClose()(scope, receive, send)
                return
            await _serve_websocket(self.runtime, name, subpath, WebSocket(scope, receive, send))
            return
        if scope["method"] not in _SERVED_METHODS:
            await _NOT_ALLOWED(scope, receive, send)
            return
        try:
            response = await _handle(self.runtime, name, _Incoming(scope, receive, subpath))
        except _Disconnected:
            return
        await response(scope, receive, send)


class _ChannelsMount(Mount):
    """Starlette's `Mount`, handing a request to its app without a coroutine of its own
    (`Mount.handle` only awaits the app): one frame less held by every webhook."""

    def handle(self, scope: Scope, receive: Receive, send: Send) -> Coroutine[Any, Any, None]:  # type: ignore[override]
        return cast(Coroutine[Any, Any, None], self.app(scope, receive, send))


def mount(runtime: Runtime) -> Mount:
    """`/channels` as the app's first route: matching it is one regular expression."""
    return _ChannelsMount(PREFIX, app=ChannelsApp(runtime), name="channels")


# HEAD reaches the adapter as FastAPI's GET routes let it (the server drops the body).
_SERVED_METHODS = frozenset((*HTTP_METHODS, "HEAD"))
_NOT_ALLOWED = JSONResponse(
    {"detail": "Method Not Allowed"}, status_code=405, headers={"Allow": ", ".join(sorted(_SERVED_METHODS))}
)

# The operations the OpenAPI document lists: path, summary prefix, description.
_DOCUMENTED = (
    ("/channels/{name}", "channel", "A platform webhook: verified and parsed by the channel's adapter."),
    (
        "/channels/{name}/{subpath}",
        "channel_path",
        "A platform webhook on a sub-path (e.g. `/channels/slack/events`).",
    ),
)


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The OpenAPI path items of the mount, one operation per method of `HTTP_METHODS`."""
    paths: dict[str, dict[str, Any]] = {}
    for path, prefix, description in _DOCUMENTED:
        names = re.findall(r"{(\w+)}", path)
        parameters = [
            {"name": n, "in": "path", "required": True, "schema": {"type": "string", "title": n.title()}}
            for n in names
        ]
        slug = re.sub(r"\W", "_", path)
        paths[path] = {
            method.lower(): {
                "tags": ["channels"],
                "summary": f"{prefix.replace('_', ' ').title()} {method.title()}",
                "description": description,
                "operationId": f"{prefix}_{method.lower()}{slug}_{method.lower()}",
                "parameters": parameters,
                "responses": {
                    "200": {
                        "description": "The adapter's answer",
                        "content": {"application/json": {"schema": {}}},
                    },
                    "default": {
                        "description": "A refused request: `{error, detail}`",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    },
                },
            }
            for method in HTTP_METHODS
        }
    return paths


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


async def _serve_websocket(runtime: Runtime, name: str, subpath: str, websocket: WebSocket) -> None:
    adapter = runtime.adapters.get(name)
    if adapter is None or not isinstance(adapter, WebSocketChannel):
        # Accept first so the client sees our close code, not a bare handshake refusal.
        await websocket.accept()
        await websocket.close(code=4404, reason=f"no WebSocket channel {name!r}")
        return
    await adapter.handle_websocket(subpath, _StarletteChannelSocket(websocket))
