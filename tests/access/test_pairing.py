"""Pairing through the signed webhook on both backends: an unknown sender gets a code and
nothing else; the operator approves it (CLI, admin API); then the sender is answered."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from datetime import timedelta

import httpx
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.access import AccessStore
from app.db.models import access_pairings, utcnow
from tests.access.support import MeteredModel, code_in, stored, texts
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes import telegram as tg
from tests.fakes.http_receiver import HttpReceiver
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import ROOT
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _cli(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": db_url, "LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "app", "access", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_unknown_sender_gets_a_code_then_is_answered_after_approval(
    serve: ServeApp, db_url: str
) -> None:
    model = MeteredModel()
    async with HttpReceiver() as receiver:
        channel = webhook_settings(access="pairing", callback_url=receiver.url)
        async with (
            serve(channel_settings={"webhook": channel}, provider=model) as srv,
            httpx.AsyncClient(timeout=30) as http,
        ):

            async def send(sender: str, text: str, wait: bool = False) -> httpx.Response:
                body = {"chat_id": f"dm-{sender}", "sender_id": sender, "text": text}
                return await post_webhook(http, srv.url, WEBHOOK_SECRET, body, wait=wait)

            first = await send("alice", "hello, who are you?")
            assert first.status_code == 202
            assert first.json()["skipped"] is True and first.json()["reason"] == "pairing"
            [notice] = texts(await receiver.wait_for(1))
            code = code_in(notice)
            assert first.json()["notice"] == notice
            # More messages while the code is pending mint nothing and say nothing more.
            for text in ("hello?", "anyone there?"):
                again = await send("alice", text)
                assert again.json()["reason"] == "pairing" and "notice" not in again.json()
            assert await stored(srv.runtime) == {"inbox": 0, "messages": 0, "outbox": 1}
            assert model.calls == []

            pending = (await http.get(f"{srv.url}/admin/api/access/pending", headers=AUTH)).json()
            assert [(p["code"], p["sender_id"], p["text"]) for p in pending["pending"]] == [
                (code, "alice", "hello, who are you?")
            ]

            approved = await asyncio.to_thread(_cli, db_url, "approve", code.lower())
            assert approved.returncode == 0, approved.stderr
            assert '"sender_id": "alice"' in approved.stdout
            used = await asyncio.to_thread(_cli, db_url, "approve", code)
            assert used.returncode == 1 and "no pending pairing code" in used.stderr  # single-use

            answered = await send("alice", "now?", wait=True)
            assert answered.status_code == 200, answered.text
            assert [r["text"] for r in answered.json()["replies"]] == ["echo now?"]
            assert model.calls == ["now?"]

            # A second sender, approved through the admin API.
            bob = await send("bob", "hi")
            assert bob.json()["reason"] == "pairing"
            bob_code = code_in(bob.json()["notice"])
            approve = f"{srv.url}/admin/api/access/approve"
            wrong = await http.post(approve, json={"code": "NOPE2345"}, headers=AUTH)
            assert wrong.status_code == 404 and wrong.json()["detail"]
            bad = await http.post(approve, json={"kode": bob_code}, headers=AUTH)
            assert bad.status_code == 422
            ok = await http.post(approve, json={"code": bob_code}, headers=AUTH)
            assert ok.status_code == 200
            assert ok.json()["approved"] == {"channel": "webhook", "sender_id": "bob"}
            answered = await send("bob", "and me?", wait=True)
            assert [r["text"] for r in answered.json()["replies"]] == ["echo and me?"]

            listed = (await http.get(f"{srv.url}/admin/api/access/entries", headers=AUTH)).json()
            assert sorted(e["subject"] for e in listed["entries"]) == ["alice", "bob"]
            assert (await http.get(f"{srv.url}/admin/api/access/pending", headers=AUTH)).json() == {
                "pending": []
            }


async def test_no_codes_in_groups_and_codes_are_bounded(serve: ServeApp) -> None:
    channel = webhook_settings(access="pairing", pairing_max_pending=2)
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:
        group = await post_webhook(
            http,
            srv.url,
            WEBHOOK_SECRET,
            {"chat_id": "g", "sender_id": "stranger", "text": "hi all", "chat_type": "group"},
        )
        assert group.json()["reason"] == "not_allowed" and "notice" not in group.json()
        notices = []
        for sender in ("a", "b", "c"):
            resp = await post_webhook(
                http, srv.url, WEBHOOK_SECRET, {"chat_id": sender, "sender_id": sender, "text": "hi"}
            )
            notices.append("notice" in resp.json())
        assert notices == [True, True, False]  # the third waits until a code is used or expires
        pending = await srv.runtime.access.store.pending("webhook")
        assert sorted(p["sender_id"] for p in pending) == ["a", "b"]


async def test_racing_requests_of_one_sender_mint_one_code(engine: AsyncEngine) -> None:
    stores = [AccessStore(engine) for _ in range(2)]
    minted = await asyncio.gather(
        *(s.request_code("telegram", "42", "42", "hi", ttl=60, max_pending=10) for s in stores * 4)
    )
    assert len([c for c in minted if c is not None]) == 1


async def test_telegram_sender_gets_the_code_in_chinese_then_is_answered(serve: ServeApp) -> None:
    """Through Telegram: the real PTB Bot sends the code to a fake Bot API server."""
    async with FakeTelegram() as fake:
        channel = tg_settings(fake, access="pairing", locale="zh")
        async with (
            serve(channel_settings={"telegram": channel}) as srv,
            httpx.AsyncClient(timeout=30) as http,
        ):
            first = await post_update(http, srv.url, tg.update(1, tg.message("你好")))
            assert first.status_code == 200 and first.json()["skipped"] is True
            [call] = await fake.wait_for("sendMessage", 1)
            assert call.params["chat_id"] == "4242"
            assert call.params["text"].startswith("我还不认识你")
            code = re.search(r"配对码是 ([A-Z0-9]{8})", call.params["text"])
            assert code is not None
            assert (await stored(srv.runtime))["inbox"] == 0
            assert await srv.runtime.access.store.approve(code.group(1), by="test") is not None
            await post_update(http, srv.url, tg.update(2, tg.message("现在呢")))
            await fake.wait_for("sendMessage", 2)
    assert fake.sent_texts()[1] == "You said: 现在呢"


async def test_an_expired_code_cannot_be_approved_and_the_next_message_gets_a_new_one(
    engine: AsyncEngine,
) -> None:
    store = AccessStore(engine)
    first = await store.request_code("webhook", "kim", "kim", "hi", ttl=600, max_pending=10)
    assert first is not None
    async with engine.begin() as conn:  # the code's hour is over
        await conn.execute(update(access_pairings).values(expires_at=utcnow() - timedelta(seconds=1)))
    assert await store.approve(first, by="test") is None
    assert await store.pending() == []
    second = await store.request_code("webhook", "kim", "kim", "hi again", ttl=600, max_pending=10)
    assert second is not None and second != first
    approved = await store.approve(f"{second[:4].lower()}-{second[4:]}", by="test")  # typed loosely
    assert approved is not None and approved.sender_id == "kim"
    assert await store.allowed("webhook", "kim", None)
