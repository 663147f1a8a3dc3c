"""`/channels/{name}/…`: hands platform requests to their adapter."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse

from app.api.deps import get_runtime
from app.channel import ChannelRequest, ChannelResponse, HttpChannel, WebSocketChannel
from app.errors import ChannelRequestError, PayloadTooLarge, UnknownChannel

router = APIRouter(tags=["channels"])


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"body of {declared} bytes is over the limit of {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _to_response(resp: ChannelResponse) -> Response:
    if isinstance(resp.body, (dict, list)):
        return JSONResponse(resp.body, status_code=resp.status, headers=resp.headers)
    body = resp.body.encode() if isinstance(resp.body, str) else (resp.body or b"")
    return Response(body, status_code=resp.status, media_type=resp.content_type, headers=resp.headers)


async def channel_root(name: str, request: Request) -> Response:
    """A platform webhook: verified and parsed by the channel's adapter."""
    return await channel_request(name, request)


async def channel_request(name: str, request: Request, subpath: str = "") -> Response:
    """A platform webhook on a sub-path (e.g. `/channels/slack/events`)."""
    runtime = get_runtime(request)
    adapter = runtime.adapters.get(name)
    if adapter is None or not isinstance(adapter, HttpChannel):
        raise UnknownChannel(f"no channel {name!r} is enabled on this server")
    try:
        body = await _read_body(request, adapter.settings.max_body_bytes)
        creq = ChannelRequest(
            method=request.method,
            path=subpath,
            headers={k.lower(): v for k, v in request.headers.items()},
            query=dict(request.query_params),
            body=body,
            client=request.client.host if request.client else None,
        )
        return _to_response(await adapter.handle_request(creq))
    except ChannelRequestError as exc:
        runtime.metrics.events_rejected.labels(name, exc.code).inc()
        raise


# One route per method, so each gets its own OpenAPI operation id.
for _method in ("GET", "POST", "PUT"):
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
