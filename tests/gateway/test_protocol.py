"""The gateway protocol against a running server, with a real WebSocket client."""

from __future__ import annotations

import asyncio
import json

import httpx
from sqlalchemy import select

from app.db.models import inbox, outbox
from tests.conftest import ADMIN_TOKEN
from tests.gateway.conftest import (
    ALICE_TOKEN,
    BOB_TOKEN,
    GatewayServe,
    gateway_client,
)


async def test_auth_refused_then_accepted(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_auth_timeout_seconds=0.5) as srv:
        async with gateway_client(srv.url) as c:
            await c.send({"type": "auth", "token": "not-a-token"})
            assert await c.closed_with() == 4001
        async with gateway_client(srv.url) as c:
            await c.send({"type": "attach", "session_key": "web:alice"})
            assert await c.closed_with() == 4001
        async with gateway_client(srv.url) as c:
            await c.ws.send("{not json")
            assert await c.closed_with() == 4001
        async with gateway_client(srv.url) as c:  # says nothing
            assert await c.closed_with() == 4001
        async with gateway_client(srv.url) as c:
            ok = await c.auth(ALICE_TOKEN)
            assert ok["subject"] == "alice"
            assert ok["session_keys"] == ["web:alice"]
            assert ok["key_prefix"] == "web:alice:"
            await c.send({"type": "ping"})
            await c.expect("pong")


async def test_key_scope_is_enforced(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv:
        # Bob's session exists and has history …
        async with gateway_client(srv.url, BOB_TOKEN) as bob:
            await bob.attach("web:bob")
            await bob.send({"type": "send", "text": "bob's secret", "client_message_id": "b1"})
            await bob.messages_until_answer()
        async with gateway_client(srv.url, ALICE_TOKEN) as alice:
            # … but knowing its key gives Alice nothing, the same answer as for a key that
            # does not exist, and the connection stays usable.
            for key in ("web:bob", "web:nobody", "web:alicex", "telegram:42"):
                await alice.send({"type": "attach", "session_key": key})
                err = await alice.expect("error")
                assert err["code"] == "forbidden"
                assert err["detail"] == "this token may not attach to that session key"
            # Sending without an attached session is refused too.
            await alice.send({"type": "send", "text": "hello"})
            assert (await alice.expect("error"))["code"] == "not_attached"
            # Exact key (the default) and keys under the prefix are allowed.
            ready = await alice.attach()
            assert ready["session_key"] == "web:alice"
            ready = await alice.attach("web:alice:work")
            assert ready["session_key"] == "web:alice:work"
            assert "bob's secret" not in json.dumps(alice.frames)
        async with srv.runtime.engine.connect() as conn:
            keys = {r[0] for r in await conn.execute(select(inbox.c.session_key))}
        assert keys == {"web:bob"}


async def test_a_message_is_acknowledged_before_the_client_sees_it_in_the_session(
    gateway_serve: GatewayServe,
) -> None:
    """A worker may start the turn as soon as the event committed, so the user message can
    reach the session bus before the accept returns. The client still gets `accepted`
    first, so it can match the message to the one it sent."""
    async with gateway_serve() as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as c:
            await c.attach("web:alice")
            for i in range(4):
                await c.send({"type": "send", "text": f"hello {i}", "client_message_id": f"m-{i}"})
                await c.messages_until_answer()
            seen = [(f["type"], f.get("event_id")) for f in c.frames if f["type"] in ("accepted", "message")]
            acks = [event_id for kind, event_id in seen if kind == "accepted"]
            assert len(acks) == 4 and len(set(acks)) == 4
            for event_id in acks:
                assert seen.count(("accepted", event_id)) == 1  # not again after the accept returned
                assert seen.index(("accepted", event_id)) < seen.index(("message", event_id))


async def test_send_reaches_the_session_with_tool_calls(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as c:
            ready = await c.attach("web:alice")
            assert ready["messages"] == [] and ready["last_seq"] == 0 and ready["session_id"] is None
            await c.send({"type": "send", "text": "what time is it?", "client_message_id": "m-1"})
            accepted = await c.expect("accepted")
            assert accepted["client_message_id"] == "m-1" and accepted["duplicate"] is False
            assert accepted["session_key"] == "web:alice"
            new = await c.expect("new_session")
            msgs = await c.messages_until_answer()
            assert [m["seq"] for m in msgs] == [1, 2, 3, 4]
            assert {m["session_id"] for m in msgs} == {new["session_id"]}
            user, call, result, answer = msgs
            assert user["role"] == "user" and user["content"] == "what time is it?"
            assert user["event_id"] == accepted["event_id"]
            assert call["tool_calls"][0]["function"]["name"] == "current_time"
            assert result["role"] == "tool" and result["tool_call_id"] == call["tool_calls"][0]["id"]
            assert answer["content"].startswith("It is ")

            # The same client message id again (a resend after a reconnect): not processed twice.
            await c.send({"type": "send", "text": "what time is it?", "client_message_id": "m-1"})
            dup = await c.expect("accepted")
            assert dup["duplicate"] is True and dup["event_id"] == accepted["event_id"]
        async with gateway_client(srv.url, BOB_TOKEN) as bob:
            # Another subject using the same client id is a different message.
            await bob.attach()
            await bob.send({"type": "send", "text": "hi", "client_message_id": "m-1"})
            assert (await bob.expect("accepted"))["duplicate"] is False
            await bob.messages_until_answer()

        # Browser replies were delivered through the bus: their outbox rows end up sent.
        async def outbox_states() -> list[str]:
            async with srv.runtime.engine.connect() as conn:
                return [
                    r[0]
                    for r in await conn.execute(select(outbox.c.status).where(outbox.c.channel == "browser"))
                ]

        for _ in range(100):
            states = await outbox_states()
            if states and all(s == "sent" for s in states):
                break
            await asyncio.sleep(0.05)
        assert states == ["sent", "sent"]
        async with srv.runtime.engine.connect() as conn:
            rows = (await conn.execute(select(inbox.c.payload))).all()
        senders = sorted(r[0]["sender_id"] for r in rows)
        assert senders == ["alice", "bob"]


async def test_bad_frames_are_answered_and_the_connection_stays(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_max_text_chars=100, gateway_max_frame_bytes=2000) as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as c:
            await c.attach()
            for bad in (
                "nope",
                "[1]",
                '{"type": "fly"}',
                '{"type": "send"}',
                '{"type": "attach", "last_seq": -1}',
            ):
                await c.ws.send(bad)
                assert (await c.expect("error"))["code"] == "bad_frame"
            await c.send({"type": "send", "text": "x" * 101, "client_message_id": "long"})
            err = await c.expect("error")
            assert err["code"] == "text_too_long" and err["client_message_id"] == "long"
            await c.send({"type": "send", "text": "   "})
            assert (await c.expect("error"))["code"] == "bad_frame"
            await c.send({"type": "ping"})
            await c.expect("pong")
            await c.ws.send(json.dumps({"type": "send", "text": "y" * 3000}))
            assert await c.closed_with() == 1009
        async with srv.runtime.engine.connect() as conn:
            assert (await conn.execute(select(inbox.c.id))).all() == []
        async with httpx.AsyncClient(timeout=30) as http:
            assert (await http.get(f"{srv.url}/healthz")).status_code == 200


async def test_signed_tokens_from_the_admin_api(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv, httpx.AsyncClient(timeout=30, base_url=srv.url) as http:
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        body = {"subject": "carol", "session_keys": ["web:carol"], "ttl_seconds": 60}
        assert (await http.post("/admin/api/gateway-tokens", json=body)).status_code == 401
        resp = await http.post("/admin/api/gateway-tokens", json=body, headers=auth)
        assert resp.status_code == 201, resp.text
        issued = resp.json()
        assert issued["subject"] == "carol" and issued["token"].startswith("cg1.")
        bad = await http.post("/admin/api/gateway-tokens", json={"subject": "x"}, headers=auth)
        assert bad.status_code == 422
        too_long = await http.post(
            "/admin/api/gateway-tokens", json={**body, "ttl_seconds": 10**7}, headers=auth
        )
        assert too_long.status_code == 400

        async with gateway_client(srv.url, issued["token"]) as c:
            ready = await c.attach()
            assert ready["session_key"] == "web:carol"
            await c.send({"type": "attach", "session_key": "web:alice"})
            assert (await c.expect("error"))["code"] == "forbidden"

        # A tampered token (scope widened, signature kept) is refused.
        head, claims, sig = issued["token"].split(".")
        import base64

        data = json.loads(base64.urlsafe_b64decode(claims + "=" * (-len(claims) % 4)))
        data["prefix"] = ""
        forged = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
        async with gateway_client(srv.url) as c:
            await c.send({"type": "auth", "token": f"{head}.{forged}.{sig}"})
            assert await c.closed_with() == 4001

        # A token that expires while connected closes the connection with 4002.
        short = (
            await http.post("/admin/api/gateway-tokens", json={**body, "ttl_seconds": 2}, headers=auth)
        ).json()
        async with gateway_client(srv.url, short["token"]) as c:
            await c.attach()
            assert await c.closed_with(timeout=8) == 4002
        async with gateway_client(srv.url) as c:  # and is refused afterwards
            await c.send({"type": "auth", "token": short["token"]})
            assert await c.closed_with() == 4001


async def test_idle_connections_are_closed(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_idle_timeout_seconds=0.6, gateway_heartbeat_seconds=0.2) as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as c:
            await c.attach()
            await c.expect("heartbeat")
            assert await c.closed_with(timeout=5) == 4009


async def test_gateway_needs_the_browser_channel(serve) -> None:  # type: ignore[no-untyped-def]
    async with serve() as srv:  # webhook only
        async with gateway_client(srv.url) as c:
            assert await c.closed_with() == 4503


async def test_a_fresh_token_on_an_open_connection(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv, httpx.AsyncClient(timeout=30, base_url=srv.url) as http:
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

        async def issue(**body: object) -> str:
            resp = await http.post(
                "/admin/api/gateway-tokens", json={"subject": "alice", **body}, headers=auth
            )
            assert resp.status_code == 201, resp.text
            return str(resp.json()["token"])

        async with gateway_client(srv.url, await issue(session_keys=["web:alice"], ttl_seconds=60)) as c:
            await c.attach("web:alice")
            # Renewing keeps the attachment.
            renewed = await issue(session_keys=["web:alice"], ttl_seconds=600)
            await c.send({"type": "auth", "token": renewed})
            await c.expect("authenticated")
            await c.send({"type": "send", "text": "still attached", "client_message_id": "1"})
            assert (await c.expect("accepted"))["session_key"] == "web:alice"
            # A bad token later is an error, not a disconnect.
            await c.send({"type": "auth", "token": "nope"})
            assert (await c.expect("error"))["code"] == "unauthorized"
            # A token for other keys detaches the connection from this one.
            await c.send({"type": "auth", "token": await issue(session_keys=["web:alice:other"])})
            await c.expect("authenticated")
            await c.send({"type": "send", "text": "where am I?", "client_message_id": "2"})
            assert (await c.expect("error"))["code"] == "not_attached"
