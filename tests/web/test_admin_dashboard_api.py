"""The dashboard's admin endpoints and its login cookie, against a real server on both backends."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import httpx
from sqlalchemy import select

from app.db.models import approvals, utcnow
from app.web.admin_cookie import sign_admin_cookie, verify_admin_cookie
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.support.timing import scaled
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
NEW_ENDPOINTS = [
    "/admin/api/overview",
    "/admin/api/timeseries",
    "/admin/api/runs",
    "/admin/api/runs/1",
    "/admin/api/approvals",
    "/admin/api/channels",
    "/admin/api/session-generations/webhook%3Ac1",
]


async def _ask(client: httpx.AsyncClient, url: str, chat_id: str, text: str) -> dict:
    resp = await post_webhook(
        client, url, WEBHOOK_SECRET, {"chat_id": chat_id, "sender_id": "u1", "text": text}, wait=True
    )
    assert resp.status_code == 200, resp.text
    return resp.json()


async def _delivered(client: httpx.AsyncClient) -> None:
    """Wait until the outbox sender delivered every reply (it runs after the turn commits)."""
    deadline = time.monotonic() + scaled(10)
    while True:
        rows = (await client.get("/admin/api/outbox", headers=AUTH)).json()["messages"]
        if rows and all(r["status"] == "sent" for r in rows):
            return
        assert time.monotonic() < deadline, rows
        await asyncio.sleep(0.05)


async def test_new_endpoints_refuse_without_or_with_a_wrong_token(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        for path in NEW_ENDPOINTS:
            assert (await client.get(path)).status_code == 401, path
            wrong = await client.get(path, headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401, path
            forged = await client.get(path, headers={"Cookie": "chatgate_admin=9999999999.deadbeef"})
            assert forged.status_code == 401, path
        # still serving
        assert (await client.get("/admin/api/overview", headers=AUTH)).status_code == 200


async def test_admin_api_is_closed_without_admin_token(serve: ServeApp) -> None:
    async with serve(admin_token=None) as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        assert (await client.get("/admin/api/overview")).status_code == 503
        login = await client.post("/admin/login", json={"token": "anything"})
        assert login.status_code == 503


async def test_overview_runs_channels_after_a_tool_call_turn(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        await _ask(client, srv.url, "c1", "what time is it?")
        await _ask(client, srv.url, "c2", "hello")
        await _delivered(client)

        ov = (await client.get("/admin/api/overview", params={"minutes": 15}, headers=AUTH)).json()
        assert ov["window_minutes"] == 15
        assert ov["sessions"]["active"] == 2
        assert ov["sessions"]["suspended"] == 0 and ov["sessions"]["expired"] == 0
        assert ov["events_in_window"] == 2
        assert ov["events_per_minute"] == round(2 / 15, 2)
        assert ov["runs"]["count"] == 2
        assert ov["runs"]["outcomes"] == {"ok": 2}
        latency = ov["runs"]["latency_ms"]
        assert latency["sampled"] == 2 and latency["p50"] is not None and latency["max"] >= latency["p50"]
        assert ov["failures"] == {"inbox_failed": 0, "outbox_failed": 0, "runs_failed": 0}
        assert set(ov["backlog"]) == {"inbox_pending", "outbox_pending"}
        assert ov["inbox"].get("done") == 2

        ts = (await client.get("/admin/api/timeseries", params={"minutes": 10}, headers=AUTH)).json()
        assert ts["bucket_seconds"] == 60
        assert 10 <= len(ts["points"]) <= 12
        assert sum(p["events"] for p in ts["points"]) == 2
        assert sum(p["runs"] for p in ts["points"]) == 2
        busy = [p for p in ts["points"] if p["runs"]]
        assert all(p["run_ms_avg"] is not None for p in busy)
        assert [p["t"] for p in ts["points"]] == sorted(p["t"] for p in ts["points"])

        runs = (await client.get("/admin/api/runs", headers=AUTH)).json()["runs"]
        assert [r["session_key"] for r in runs] == ["webhook:c2", "webhook:c1"]
        timed = runs[1]
        assert [c["name"] for c in timed["tool_calls"]] == ["current_time"]
        assert timed["outcome"] == "ok" and timed["duration_ms"] is not None
        only_c1 = (
            await client.get("/admin/api/runs", params={"session_key": "webhook:c1"}, headers=AUTH)
        ).json()
        assert [r["id"] for r in only_c1["runs"]] == [timed["id"]]
        older = (
            await client.get("/admin/api/runs", params={"before_id": runs[0]["id"]}, headers=AUTH)
        ).json()
        assert [r["id"] for r in older["runs"]] == [timed["id"]]

        detail = (await client.get(f"/admin/api/runs/{timed['id']}", headers=AUTH)).json()
        assert [(m["role"], m["name"]) for m in detail["messages"]] == [
            ("assistant", None),
            ("tool", "current_time"),
            ("assistant", None),
        ]
        assert detail["generation"] == 1 and detail["approvals"] == []
        assert (await client.get("/admin/api/runs/99999", headers=AUTH)).status_code == 404

        chans = (await client.get("/admin/api/channels", headers=AUTH)).json()["channels"]
        webhook = next(c for c in chans if c["name"] == "webhook")
        assert webhook["enabled"] is True and webhook["adapter"]
        assert webhook["health"] == "ok"
        assert webhook["inbound_recent"] == 2 and webhook["last_inbound_at"]
        assert webhook["outbound_recent"] == 2 and webhook["last_outbound_at"]
        assert webhook["session_scope"] == "chat" and webhook["busy_policy"] == "queue"


async def test_approvals_list_shows_stored_requests(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        await _ask(client, srv.url, "c1", "hello")
        now = utcnow()
        async with srv.runtime.engine.begin() as conn:
            for status, call in (("approved", "call_a"), ("pending", "call_b")):
                await conn.execute(
                    approvals.insert().values(
                        session_id=1,
                        session_key="webhook:c1",
                        run_id=None,
                        tool_call_id=call,
                        tool_name="shell",
                        arguments={"cmd": "ls"},
                        status=status,
                        requested_at=now,
                        expires_at=now + timedelta(minutes=5),
                        decided_at=now if status == "approved" else None,
                        decided_by="webhook:u1" if status == "approved" else None,
                    )
                )
        everything = (await client.get("/admin/api/approvals", headers=AUTH)).json()["approvals"]
        assert [a["tool_call_id"] for a in everything] == ["call_b", "call_a"]
        assert everything[1]["decided_by"] == "webhook:u1"
        assert everything[0]["arguments"] == {"cmd": "ls"}
        pending = (
            await client.get("/admin/api/approvals", params={"status": "pending"}, headers=AUTH)
        ).json()
        assert [a["tool_call_id"] for a in pending["approvals"]] == ["call_b"]
        other = await client.get("/admin/api/approvals", params={"session_key": "webhook:zz"}, headers=AUTH)
        assert other.json()["approvals"] == []
        async with srv.runtime.engine.connect() as conn:
            assert len((await conn.execute(select(approvals.c.id))).all()) == 2  # reading changed nothing


async def test_generations_after_reset_and_reopen(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        await _ask(client, srv.url, "c1", "first")
        reset = await client.post("/admin/api/sessions/webhook%3Ac1/reset", headers=AUTH)
        assert reset.status_code == 202
        deadline = time.monotonic() + scaled(10)
        while (await client.get("/admin/api/sessions/webhook%3Ac1", headers=AUTH)).json()[
            "status"
        ] == "active":
            assert time.monotonic() < deadline, "reset was not processed"
            await asyncio.sleep(0.05)
        await _ask(client, srv.url, "c1", "second")

        gens = (await client.get("/admin/api/session-generations/webhook%3Ac1", headers=AUTH)).json()
        assert [(g["generation"], g["status"], g["current"]) for g in gens["generations"]] == [
            (2, "active", True),
            (1, "expired", False),
        ]
        assert gens["generations"][1]["message_count"] == 2
        reopen = await client.post(
            "/admin/api/sessions/webhook%3Ac1/reopen", params={"generation": 1}, headers=AUTH
        )
        assert reopen.status_code == 200
        gens = (await client.get("/admin/api/session-generations/webhook%3Ac1", headers=AUTH)).json()
        assert [(g["generation"], g["current"]) for g in gens["generations"]] == [(2, False), (1, True)]
        missing = await client.get("/admin/api/session-generations/webhook%3Anone", headers=AUTH)
        assert missing.status_code == 404


async def test_login_cookie_authorizes_reads_and_guarded_writes(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        await _ask(client, srv.url, "c1", "hello")
        assert (await client.post("/admin/login", json={"token": "wrong"})).status_code == 401
        assert (await client.post("/admin/login", json={})).status_code == 400
        assert (await client.post("/admin/login", content=b"{not json", headers=_json())).status_code == 400
        assert (await client.post("/admin/login", content=b"token", headers=_text())).status_code == 415
        assert "chatgate_admin" not in client.cookies

        login = await client.post("/admin/login", json={"token": ADMIN_TOKEN})
        assert login.status_code == 200
        set_cookie = login.headers["set-cookie"].lower()
        for attr in ("httponly", "samesite=strict", "path=/admin", "max-age="):
            assert attr in set_cookie
        cookie = client.cookies["chatgate_admin"]
        assert verify_admin_cookie(ADMIN_TOKEN, cookie)
        assert not verify_admin_cookie("another-token", cookie)

        assert (await client.get("/admin/api/overview")).status_code == 200
        assert (await client.get("/admin/api/sessions")).status_code == 200
        # A write on the cookie alone (what a cross-site form could send) is refused …
        assert (await client.post("/admin/api/sessions/webhook%3Ac1/reset")).status_code == 403
        # … and accepted with the header only same-origin scripts can add.
        ok = await client.post("/admin/api/sessions/webhook%3Ac1/reset", headers={"X-Requested-With": "x"})
        assert ok.status_code == 202

        out = await client.post("/admin/logout")
        assert out.status_code == 200
        assert "chatgate_admin" not in client.cookies
        assert (await client.get("/admin/api/overview")).status_code == 401


async def test_expired_cookie_and_form_login(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        stale = sign_admin_cookie(ADMIN_TOKEN, ttl=60, now=time.time() - 120)
        resp = await client.get("/admin/api/overview", headers={"Cookie": f"chatgate_admin={stale}"})
        assert resp.status_code == 401
        form = await client.post("/admin/login", data={"token": ADMIN_TOKEN})
        assert form.status_code == 303 and form.headers["location"] == "/admin"
        assert (await client.get("/admin/api/channels")).status_code == 200


async def test_pages_static_files_and_openapi(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        for path, marker in (("/", "chat.js"), ("/admin", "admin.js")):
            page = await client.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert marker in page.text
            assert "script-src 'self'" in page.headers["content-security-policy"]
        for asset in ("/ui/chat.js", "/ui/admin.js", "/ui/app.css"):
            assert (await client.get(asset)).status_code == 200, asset
        assert (await client.get("/ui/../pages.py")).status_code == 404
        schema = (await client.get("/openapi.json")).json()
        for path in (
            "/admin/api/overview",
            "/admin/api/timeseries",
            "/admin/api/runs",
            "/admin/api/runs/{run_id}",
            "/admin/api/approvals",
            "/admin/api/channels",
            "/admin/api/session-generations/{key}",
            "/admin/login",
            "/admin/logout",
        ):
            assert path in schema["paths"], path
        assert schema["paths"]["/admin/api/overview"]["get"]["summary"]
        assert "/" not in schema["paths"] and "/admin" not in schema["paths"]


def _json() -> dict[str, str]:
    return {"Content-Type": "application/json"}


def _text() -> dict[str, str]:
    return {"Content-Type": "text/plain"}
