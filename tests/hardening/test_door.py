"""Hostile input at the door (issue 16, items 1, 4, 5, 7, 9): each gets a 4xx with a reason,
nothing is stored, and the server keeps serving. Driven over HTTP against the real server,
on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime

import httpx
import pytest
from sqlalchemy import insert

from app.api.app import create_app
from app.db.models import inbox
from tests.channels.support import count, inbox_keys
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, make_settings
from tests.fakes import telegram as tg
from tests.hardening.channels import JSON_CHANNELS, json_channel_settings
from tests.support.webhook import post_webhook

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
DEEP = "[" * 10_000 + "]" * 10_000

# Raw JSON fragments put where a message's text goes.
HOSTILE_TEXT = {
    "lone surrogate": '"before \\ud800 after"',
    "lone low surrogate": '"\\udc00"',
    "NUL": '"before \\u0000 after"',
    "10,000 nested arrays": DEEP,
    "10,000 nested objects": '{"a":' * 10_000 + "1" + "}" * 10_000,
}


async def test_every_json_channel_refuses_unstorable_text_and_deep_nesting(serve: ServeApp) -> None:
    async with json_channel_settings() as channel_settings:
        async with serve(channel_settings=channel_settings) as srv, httpx.AsyncClient(timeout=30) as client:
            n = 100
            for channel in JSON_CHANNELS:
                for what, fragment in HOSTILE_TEXT.items():
                    n += 1
                    resp = await channel.post(client, srv.url, channel.body_with(n, fragment))
                    assert resp.status_code == 400, (channel.name, what, resp.status_code, resp.text)
                    assert resp.json()["detail"], (channel.name, what)
                assert await count(srv.runtime, inbox) == 0, channel.name
            # The server keeps serving: a clean message on every channel is accepted.
            for channel in JSON_CHANNELS:
                n += 1
                resp = await channel.post(client, srv.url, channel.body_with(n, '"hello"'))
                assert 200 <= resp.status_code < 300, (channel.name, resp.text)
            assert await count(srv.runtime, inbox) == len(JSON_CHANNELS)
            assert (await client.get(f"{srv.url}/healthz")).status_code == 200


async def test_webhook_parameters_and_ids_are_checked_before_anything_is_stored(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        ok = {"chat_id": "c1", "sender_id": "alice", "text": "hi"}
        for timeout in ("abc", "nan", "inf", ""):
            body = json.dumps(ok).encode()
            from tests.support.webhook import signed_headers

            resp = await client.post(
                f"{srv.url}/channels/webhook",
                params={"wait": "true", "timeout": timeout},
                content=body,
                headers=signed_headers(WEBHOOK_SECRET, body),
            )
            assert resp.status_code == 400, (timeout, resp.text)
            assert "timeout" in resp.json()["detail"]
        for bad_id in ("a\nb", "a\rb", "a\x00b", "a\tb", "\ud800"):
            for field in ("chat_id", "sender_id", "thread_id"):
                resp = await post_webhook(client, srv.url, WEBHOOK_SECRET, {**ok, field: bad_id})
                assert resp.status_code == 400, (field, repr(bad_id), resp.text)
        assert await count(srv.runtime, inbox) == 0
        resp = await post_webhook(client, srv.url, WEBHOOK_SECRET, ok, wait=True, timeout=5)
        assert resp.status_code == 200, resp.text
        assert await inbox_keys(srv.runtime) == ["webhook:c1"]


async def test_telegram_ids_that_are_not_integers_are_refused() -> None:
    # Pure parser check, no server needed: `parse_update` is what the webhook route calls.
    from app.errors import InvalidPayload
    from channels.telegram.parse import BotIdentity, parse_update
    from channels.telegram.settings import TelegramSettings

    settings = TelegramSettings(_env_file=None, bot_token="1:x")  # type: ignore[call-arg]
    for bad in ({"id": 1}, [1], "4242", 1.5, True, None):
        msg = tg.message("hi")
        msg["chat"] = {**msg["chat"], "id": bad}
        with pytest.raises(InvalidPayload):
            parse_update(tg.update(1, msg), None, settings, BotIdentity(None, "bot"))


async def test_telegram_chat_id_object_gets_400_over_http(serve: ServeApp) -> None:
    async with json_channel_settings() as channel_settings:
        async with serve(channel_settings=channel_settings) as srv, httpx.AsyncClient(timeout=30) as client:
            [telegram] = [c for c in JSON_CHANNELS if c.name == "telegram"]
            body = telegram.body_with(7, '"hi"').replace(b'"id": 4242, "type"', b'"id": {"x": 1}, "type"', 1)
            assert b'{"x": 1}' in body
            resp = await telegram.post(client, srv.url, body)
            assert resp.status_code == 400, resp.text
            assert "chat.id" in resp.json()["detail"]
            assert await count(srv.runtime, inbox) == 0


async def test_admin_api_refuses_huge_integers_and_nul_and_serialises_odd_rows(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30, headers=ADMIN) as client:
        api = f"{srv.url}/admin/api"
        huge = "68790223724269361974219095654006784"
        for method, path in (
            ("DELETE", f"/cron-jobs/{huge}"),
            ("GET", f"/cron-jobs/{huge}"),
            ("POST", f"/cron-jobs/{huge}/enable"),
            ("GET", f"/runs/{huge}"),
            ("GET", "/sessions?offset=371006590240655813902336"),
            ("GET", "/cron-jobs?offset=371006590240655813902336"),
            ("GET", f"/runs?before_id={huge}"),
            ("GET", f"/sessions/webhook%3Ax/messages?after_seq={huge}"),
            ("GET", f"/sessions/webhook%3Ax/messages?generation={huge}"),
        ):
            resp = await client.request(method, api + path)
            assert resp.status_code == 422, (method, path, resp.status_code, resp.text)
        for path in (
            "/sessions?q=%00",
            "/sessions?key=a%00b",
            "/sessions/webhook%3Aa%00b",
            "/inbox?status=%00",
        ):
            resp = await client.get(api + path)
            assert resp.status_code == 400, (path, resp.text)
            assert "NUL" in resp.json()["detail"]
        # A row stored before chatgate refused such text (or written by another tool) still lists.
        now = datetime.now(UTC)
        async with srv.runtime.engine.begin() as conn:
            await conn.execute(
                insert(inbox).values(
                    event_id="legacy-odd-row",
                    channel="webhook",
                    external_id=None,
                    session_key="webhook:legacy",
                    payload={"parts": [{"type": "text", "text": "odd \ud800 text"}]},
                    status="failed",
                    attempts=5,
                    error="could not append",
                    created_at=now,
                    updated_at=now,
                )
            )
        resp = await client.get(f"{api}/inbox")
        assert resp.status_code == 200, resp.text
        [row] = resp.json()["events"]
        assert row["payload"]["parts"][0]["text"] == "odd \ud800 text"
        assert (await client.get(f"{api}/sessions")).status_code == 200


async def test_admin_keys_with_a_slash_resolve_to_themselves(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        for chat in ("victim", "victim/messages", "a/b%2Fc"):
            resp = await post_webhook(
                client,
                srv.url,
                WEBHOOK_SECRET,
                {"chat_id": chat, "sender_id": "s", "text": f"I am {chat}"},
                wait=True,
            )
            assert resp.status_code == 200, resp.text
        api = f"{srv.url}/admin/api"

        def q(key: str) -> str:
            return urllib.parse.quote(key, safe="")

        victim = (await client.get(f"{api}/sessions/{q('webhook:victim')}/messages", headers=ADMIN)).json()
        assert victim["key"] == "webhook:victim"
        # The attacker-named session is shown as itself, on every route that takes a key.
        resp = await client.get(f"{api}/sessions/{q('webhook:victim/messages')}", headers=ADMIN)
        assert resp.status_code == 200, resp.text
        assert resp.json()["key"] == "webhook:victim/messages"
        resp = await client.get(f"{api}/sessions/{q('webhook:victim/messages')}/messages", headers=ADMIN)
        assert resp.json()["key"] == "webhook:victim/messages"
        assert resp.json()["messages"][0]["content"] == "I am victim/messages"
        # `%` in a chat id is escaped in the key (`%25`); the key travels percent-encoded once more.
        resp = await client.get(f"{api}/sessions/{q('webhook:a/b%252Fc')}/messages", headers=ADMIN)
        assert resp.json()["key"] == "webhook:a/b%252Fc"
        assert resp.json()["messages"][0]["content"] == "I am a/b%2Fc"
        resp = await client.get(f"{api}/session-generations/{q('webhook:victim/messages')}", headers=ADMIN)
        assert resp.status_code == 200, resp.text
        resp = await client.get(f"{api}/sessions/{q('webhook:victim/runs')}/runs", headers=ADMIN)
        assert resp.json()["key"] == "webhook:victim/runs"


async def test_admin_bodies_with_unstorable_text_get_4xx_and_store_nothing(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30, headers=ADMIN) as client:
        api = f"{srv.url}/admin/api"
        for odd in ("a\\u0000b", "a\\ud800b"):
            job = (
                '{"prompt": "' + odd + '", "schedule": "0 9 * * *", '
                '"target": {"channel": "webhook", "chat_id": "c' + odd + '"}}'
            )
            resp = await client.post(
                f"{api}/cron-jobs", content=job.encode(), headers={"Content-Type": "application/json"}
            )
            assert 400 <= resp.status_code < 500, (odd, resp.status_code, resp.text)
            link = '{"identity": "webhook:' + odd + '", "person_id": "alice"}'
            resp = await client.post(
                f"{api}/identity-links", content=link.encode(), headers={"Content-Type": "application/json"}
            )
            assert 400 <= resp.status_code < 500, (odd, resp.status_code, resp.text)
        assert (await client.get(f"{api}/cron-jobs")).json()["jobs"] == []
        assert (await client.get(f"{api}/identity-links")).status_code == 200


async def test_a_platform_id_longer_than_the_inbox_holds_gets_400(serve: ServeApp) -> None:
    async with json_channel_settings() as channel_settings:
        async with serve(channel_settings=channel_settings) as srv, httpx.AsyncClient(timeout=30) as client:
            [qq] = [c for c in JSON_CHANNELS if c.name == "qq"]
            payload = json.loads(qq.body_with(1, '"hi"'))
            payload["d"]["id"] = "m" * 300
            body = json.dumps(payload).encode()
            resp = await qq.post(client, srv.url, body)
            assert resp.status_code == 400, resp.text
            assert "longer than 256" in resp.json()["detail"]
            assert await count(srv.runtime, inbox) == 0
            assert (await qq.post(client, srv.url, qq.body_with(2, '"hi"'))).status_code == 200


async def test_a_content_length_that_is_not_a_number_gets_400_before_any_route(db_url: str) -> None:
    """The app's door refuses a declared length it cannot read as a number before any route
    reads a body (HTTP servers refuse most such requests themselves; an ASGI server that
    passes one on gets this answer), and keeps serving."""
    app = create_app(make_settings(db_url), channel_settings={})
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        refused = await client.post("/admin/login", content=b"hello", headers={"Content-Length": "abc"})
        after = await client.get("/healthz")
    assert (refused.status_code, refused.json()) == (400, {"detail": "Content-Length is not a number"})
    assert after.status_code == 200
