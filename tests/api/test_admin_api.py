"""The admin read API, health endpoints and metrics, through a real server."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_admin_api_requires_the_bearer_token(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(f"{srv.url}/admin/api/sessions")).status_code == 401
        wrong = await client.get(f"{srv.url}/admin/api/sessions", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert (await client.get(f"{srv.url}/admin/api/sessions", headers=AUTH)).status_code == 200
    async with serve(admin_token=None) as srv, httpx.AsyncClient(timeout=30) as client:
        closed = await client.get(f"{srv.url}/admin/api/sessions", headers=AUTH)
        assert closed.status_code == 503


async def test_sessions_filters_detail_and_messages_with_encoded_keys(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        odd = "room/1:a%b"
        for chat in ("plain", odd):
            resp = await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": chat, "sender_id": "u", "text": "hi"}, wait=True
            )
            assert resp.status_code == 200
        key = resp.json()["session_key"]
        assert key == "webhook:room/1%3Aa%25b"

        listing = (await client.get(f"{srv.url}/admin/api/sessions", headers=AUTH)).json()["sessions"]
        assert {s["key"] for s in listing} == {"webhook:plain", key}
        by_channel = await client.get(
            f"{srv.url}/admin/api/sessions", params={"channel": "other"}, headers=AUTH
        )
        assert by_channel.json()["sessions"] == []
        by_key = await client.get(f"{srv.url}/admin/api/sessions", params={"key": key}, headers=AUTH)
        assert [s["key"] for s in by_key.json()["sessions"]] == [key]
        by_status = await client.get(
            f"{srv.url}/admin/api/sessions", params={"status": "expired"}, headers=AUTH
        )
        assert by_status.json()["sessions"] == []

        detail = await client.get(f"{srv.url}/admin/api/sessions/{quote(key, safe='')}", headers=AUTH)
        assert detail.status_code == 200
        body = detail.json()
        assert body["key"] == key and body["status"] == "active" and body["message_count"] == 2
        assert body["inbox_pending"] == 0 and body["generations"] == 1

        msgs = await client.get(f"{srv.url}/admin/api/sessions/{quote(key, safe='')}/messages", headers=AUTH)
        rows = msgs.json()["messages"]
        assert [(m["seq"], m["role"], m["content"]) for m in rows] == [
            (1, "user", "hi"),
            (2, "assistant", "You said: hi"),
        ]
        assert set(rows[0]) >= {"seq", "role", "content", "tool_calls", "tool_call_id", "created_at"}

        missing = await client.get(
            f"{srv.url}/admin/api/sessions/{quote('webhook:nope', safe='')}", headers=AUTH
        )
        assert missing.status_code == 404


async def test_admin_reset_is_queued_and_opens_a_new_generation(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "one"}, wait=True
        )
        reset = await client.post(f"{srv.url}/admin/api/sessions/webhook%3Ac/reset", headers=AUTH)
        assert reset.status_code == 202
        done = await srv.runtime.waiters.wait_for_replies(reset.json()["event_id"], 10)
        assert done.done and done.replies == []  # silent: the chat is not told
        await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "two"}, wait=True
        )
        detail = (await client.get(f"{srv.url}/admin/api/sessions/webhook%3Ac", headers=AUTH)).json()
        assert detail["generation"] == 2 and detail["message_count"] == 2
        old = await client.get(
            f"{srv.url}/admin/api/sessions/webhook%3Ac/messages?generation=1", headers=AUTH
        )
        assert [m["content"] for m in old.json()["messages"]] == ["one", "You said: one"]


async def test_health_readiness_and_metrics(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        assert (await client.get(f"{srv.url}/healthz")).json() == {"status": "ok"}
        assert (await client.get(f"{srv.url}/readyz")).status_code == 200
        await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "x"}, wait=True
        )
        await client.post(
            f"{srv.url}/channels/webhook", content=b"{}", headers={"Content-Type": "application/json"}
        )
        metrics = (await client.get(f"{srv.url}/metrics")).text
    assert 'chatgate_events_accepted_total{channel="webhook"} 1.0' in metrics
    assert 'chatgate_events_rejected_total{channel="webhook",reason="unauthorized"} 1.0' in metrics
    assert "chatgate_inbox_backlog 0.0" in metrics


@pytest.mark.empty_database
async def test_readyz_fails_when_the_schema_is_not_migrated(serve: ServeApp) -> None:
    async with serve(auto_migrate=False) as srv, httpx.AsyncClient(timeout=30) as client:
        resp = await client.get(f"{srv.url}/readyz")
    assert resp.status_code == 503
    assert resp.json()["status"] == "unavailable"


async def test_archive_and_reopen_take_the_key_lease(serve: ServeApp) -> None:
    from app.sessions import lease as leases

    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        for text in ("one", "/new", "two"):
            await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": text}, wait=True
            )
        # A worker (here: another owner) holds the key: the admin write must not race it.
        held = None
        for _ in range(100):  # the real worker releases the key just after its reply
            held = await leases.acquire(srv.runtime.engine, "webhook:c", "busy-worker", ttl=30)
            if held is not None:
                break
            await asyncio.sleep(0.05)
        assert held is not None
        busy = await client.post(f"{srv.url}/admin/api/sessions/webhook%3Ac/archive", headers=AUTH)
        assert busy.status_code == 409
        current = (await client.get(f"{srv.url}/admin/api/sessions/webhook%3Ac", headers=AUTH)).json()
        assert current["status"] == "active" and current["generation"] == 2
        await leases.release(srv.runtime.engine, held)

        archived = await client.post(f"{srv.url}/admin/api/sessions/webhook%3Ac/archive", headers=AUTH)
        assert archived.status_code == 200
        current = (await client.get(f"{srv.url}/admin/api/sessions/webhook%3Ac", headers=AUTH)).json()
        assert current["status"] == "archived"
        reopened = await client.post(
            f"{srv.url}/admin/api/sessions/webhook%3Ac/reopen", params={"generation": 1}, headers=AUTH
        )
        assert reopened.status_code == 200
        current = (await client.get(f"{srv.url}/admin/api/sessions/webhook%3Ac", headers=AUTH)).json()
        assert current["generation"] == 1 and current["status"] == "active"
        assert current["lease"]["owner"] is None  # the admin released the key again
