"""Routing of /channels/…: unknown channels get a clear answer over HTTP and WebSocket."""

from __future__ import annotations

import httpx
import pytest
import websockets
from websockets.exceptions import ConnectionClosed

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
