"""The browser gateway under hostile clients (issue 16, items 3, 5, 6, 9): oversized and
deeply nested frames, prefix grants, a flood of sends. Real server, real WebSocket client."""

from __future__ import annotations

import json

import httpx
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from app.db.models import inbox
from app.gateway.tokens import GatewayGrant
from tests.channels.support import count
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.gateway.conftest import ALICE_TOKEN, GatewayServe, gateway_client, ws_url
from tests.support.webhook import post_webhook

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def test_a_prefix_grant_matches_whole_key_components() -> None:
    grant = GatewayGrant("s", key_prefix="webhook:a")
    assert grant.allows("webhook:a")
    assert grant.allows("webhook:a:thread")
    assert not grant.allows("webhook:ab")
    assert not grant.allows("webhook:a%3Ab")
    below = GatewayGrant("s", key_prefix="web:")
    assert below.allows("web:x") and not below.allows("webx")
    assert GatewayGrant("s", key_prefix="").allows("anything")


async def test_a_prefix_token_cannot_attach_to_or_list_a_longer_key(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv, httpx.AsyncClient(timeout=30) as http:
        for chat in ("a", "ab"):
            body = {"chat_id": chat, "sender_id": "s", "text": f"secret of {chat}"}
            assert (await post_webhook(http, srv.url, WEBHOOK_SECRET, body, wait=True)).status_code == 200
        # The issuing API refuses prefixes that cut a component's escape in two.
        for bad in ("webhook:a%", "webhook:a%3", "webhook::a"):
            resp = await http.post(
                f"{srv.url}/admin/api/gateway-tokens", headers=ADMIN, json={"subject": "m", "key_prefix": bad}
            )
            assert resp.status_code == 422, (bad, resp.text)
        resp = await http.post(
            f"{srv.url}/admin/api/gateway-tokens",
            headers=ADMIN,
            json={"subject": "m", "key_prefix": "webhook:a"},
        )
        assert resp.status_code == 201, resp.text
        token = resp.json()["token"]
        async with gateway_client(srv.url, token) as client:
            await client.send({"type": "attach", "session_key": "webhook:ab"})
            refused = await client.expect("error")
            assert refused["code"] == "forbidden"
            ready = await client.attach("webhook:a")
            assert ready["session_key"] == "webhook:a"
            await client.send({"type": "list_sessions"})
            listed = await client.expect("sessions")
            assert [s["key"] for s in listed["sessions"]] == ["webhook:a"]


async def test_deep_and_unstorable_frames_get_an_error_frame_and_the_connection_survives(
    gateway_serve: GatewayServe,
) -> None:
    async with gateway_serve() as srv, gateway_client(srv.url, ALICE_TOKEN) as client:
        await client.attach("web:alice")
        deep = '{"type": "send", "text": ' + "[" * 10_000 + "]" * 10_000 + "}"
        await client.ws.send(deep)
        error = await client.expect("error")
        assert error["code"] == "bad_frame" and "nested" in error["detail"]
        for text in ("a\\ud800b", "a\\u0000b"):
            await client.ws.send('{"type": "send", "text": "' + text + '", "client_message_id": "c"}')
            error = await client.expect("error")
            assert error["code"] == "bad_frame", error
            assert "NUL" in error["detail"] or "surrogate" in error["detail"]
        await client.ws.send('{"type": "send", "text": "hi", "client_message_id": "x\\ud800"}')
        assert (await client.expect("error"))["code"] == "bad_frame"
        await client.ws.send('{"type": "attach", "session_key": "web:alice\\u0000x"}')
        assert (await client.expect("error"))["code"] == "bad_frame"
        assert await count(srv.runtime, inbox) == 0
        # Still open and serving: a clean message goes through on the same connection.
        await client.send({"type": "send", "text": "still here", "client_message_id": "ok-1"})
        accepted = await client.expect("accepted", client_message_id="ok-1")
        assert accepted["duplicate"] is False
        assert await count(srv.runtime, inbox) == 1


async def test_a_first_frame_over_the_limit_closes_before_auth(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_max_frame_bytes=4096) as srv:
        # Over the server's frame limit (= GATEWAY_MAX_FRAME_BYTES here): refused by the
        # WebSocket layer while reading, with 1009 "message too big".
        async with connect(ws_url(srv.url), max_size=None) as ws:
            await ws.send(json.dumps({"type": "auth", "token": "x" * 100_000}))
            try:
                await ws.recv()
                raise AssertionError("the server answered an oversized first frame")
            except ConnectionClosed as exc:
                assert exc.rcvd is not None and exc.rcvd.code == 1009
        async with gateway_client(srv.url, ALICE_TOKEN) as client:  # the server keeps serving
            assert (await client.attach("web:alice"))["session_key"] == "web:alice"


async def test_sends_are_rate_limited_per_connection_and_per_subject(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_sends_per_minute=3, gateway_subject_sends_per_minute=5) as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as one, gateway_client(srv.url, ALICE_TOKEN) as two:
            await one.attach("web:alice")
            await two.attach("web:alice")
            for i in range(3):
                await one.send({"type": "send", "text": f"m{i}", "client_message_id": f"one-{i}"})
                await one.expect("accepted", client_message_id=f"one-{i}")
            await one.send({"type": "send", "text": "too many", "client_message_id": "one-3"})
            limited = await one.expect("error", client_message_id="one-3")
            assert limited["code"] == "rate_limited"
            assert "this connection may send 3 messages a minute" in limited["detail"]
            assert limited["retry_after"] >= 1
            # Another connection of the same subject has its own 3, but the subject only 5.
            for i in range(2):
                await two.send({"type": "send", "text": f"t{i}", "client_message_id": f"two-{i}"})
                await two.expect("accepted", client_message_id=f"two-{i}")
            await two.send({"type": "send", "text": "too many", "client_message_id": "two-2"})
            limited = await two.expect("error", client_message_id="two-2")
            assert limited["code"] == "rate_limited" and "this subject" in limited["detail"]
            # Both connections stay open and answer pings.
            for client in (one, two):
                await client.send({"type": "ping"})
                await client.expect("pong")
        assert await count(srv.runtime, inbox) == 5
