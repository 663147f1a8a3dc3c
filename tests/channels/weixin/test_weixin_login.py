"""QR-code login (CLI and in-process) against the fake, and a session that expires (errcode -14)."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.channel_records import ChannelRecords
from channels.weixin import login
from channels.weixin.api import Identity, ILinkClient
from channels.weixin.doctor import check
from tests.channels.support import wait_outbox_final
from tests.channels.weixin.support import wx_settings
from tests.conftest import ADMIN_TOKEN, ServeApp, make_settings
from tests.fakes import weixin as wx
from tests.fakes.weixin import FakeILink
from tests.support.servers import ROOT

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _chatgate(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        cwd=ROOT,
        env={**os.environ, **env},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_cli_login_shows_the_qr_and_stores_the_token(db_url: str, engine: AsyncEngine) -> None:
    async with FakeILink() as fake:
        env = {
            "DATABASE_URL": db_url,
            "WEIXIN_API_BASE_URL": fake.url,
            "CHANNELS": "weixin",
            "LOG_LEVEL": "WARNING",
        }
        code, out, err = await _chatgate("channels", "weixin", "login", env=env)
        assert code == 0, err
        assert "https://liteapp.weixin.qq.com/q/7GiQu1?qrcode=qr-1" in out
        assert "█" in out or "▀" in out  # the QR drawn in the terminal
        [asked] = fake.calls_of("get_bot_qrcode")
        assert asked.query["bot_type"] == "3" and asked.body == {"local_token_list": []}
        statuses = fake.calls_of("get_qrcode_status")
        assert [c.query["qrcode"] for c in statuses] == ["qr-1"] * 3
        stored = await login.load(ChannelRecords(engine, "weixin"), "default")
        assert stored is not None
        assert (stored.bot_token, stored.base_url, stored.bot_id, stored.status) == (
            fake.new_token,
            fake.url,
            wx.BOT_ID,
            "active",
        )
        code, out, _ = await _chatgate("channels", "weixin", "status", env=env)
        assert code == 0 and "active" in out and wx.BOT_ID in out
        # doctor reads the stored login and asks iLink with it.
        _code, out, _ = await _chatgate("doctor", "--json", env=env)
        [line] = [c for c in json.loads(out) if c["check"] == "channel weixin"]
        assert line["ok"], line
        assert fake.calls_of("getconfig")[-1].headers["Authorization"] == f"Bearer {fake.new_token}"


async def test_an_expired_session_pauses_polling_until_a_new_login(serve: ServeApp, db_url: str) -> None:
    async with FakeILink() as fake:
        await fake.push(wx.text_message("first"))
        settings = wx_settings(fake)
        async with serve(channel_settings={"weixin": settings}) as srv:
            await wait_outbox_final(srv.runtime, 1)
            records = ChannelRecords(srv.runtime.engine, "weixin")
            fake.expired_tokens.add(wx.TOKEN)  # iLink now answers errcode -14
            await fake.push(wx.text_message("while expired"))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while (stored := await login.load(records, "default")) is None or stored.status != "expired":
                assert loop.time() < deadline, "the expiry was not recorded"
                await asyncio.sleep(0.05)
            adapter = srv.runtime.adapters["weixin"]
            assert adapter.expired is not None and "-14" in adapter.expired
            polls = len(fake.calls_of("getupdates"))
            ok, detail = await check(make_settings(db_url), settings)
            assert not ok and "expired" in detail and "chatgate channels weixin login" in detail
            assert len(fake.calls_of("getupdates")) == polls  # paused: no spinning on -14
            async with httpx.AsyncClient(timeout=30, base_url=srv.url, headers=ADMIN) as admin:
                listed = (await admin.get("/admin/api/channels")).json()["channels"]
                [shown] = [c for c in listed if c["name"] == "weixin"]
                assert shown["health"] == "degraded" and "-14" in shown["last_error"]
                status = (await admin.get("/admin/api/channels/weixin/login")).json()
                assert status["stored"]["status"] == "expired" and "-14" in status["paused"]

            # A new QR login (as the CLI or the dashboard runs it) resumes the poll.
            async with httpx.AsyncClient(timeout=30) as http:
                client = ILinkClient(http, fake.url, None, Identity())
                result = await login.run_login(
                    client,
                    records,
                    account="default",
                    bot_type="3",
                    timeout=20,
                    progress=login.LoginProgress(),
                    pause=0.01,
                )
            assert result.ok, result.message
            # The QR request named the expired token, as Tencent's client does.
            assert fake.calls_of("get_bot_qrcode")[-1].body == {"local_token_list": [wx.TOKEN]}
            # The answer refused during the expiry is retried by the outbox, now with the new token.
            await fake.wait_until(lambda: len(fake.sent()) >= 2)
            assert adapter.expired is None
    assert fake.sent_texts() == ["You said: first", "You said: while expired"]
    assert fake.calls_of("sendmessage")[-1].headers["Authorization"] == f"Bearer {fake.new_token}"


async def test_without_a_login_nothing_polls_and_doctor_says_how_to_log_in(
    serve: ServeApp, db_url: str
) -> None:
    async with FakeILink() as fake:
        settings = wx_settings(fake, bot_token=None)
        async with serve(channel_settings={"weixin": settings}) as srv:
            ok, detail = await check(make_settings(db_url), settings)
            assert not ok and "not logged in" in detail
            adapter = srv.runtime.adapters["weixin"]
            assert adapter.expired is not None and "not logged in" in adapter.expired
    assert fake.calls_of("getupdates") == []


async def test_dashboard_login_shows_the_qr_and_the_poll_starts(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        settings = wx_settings(fake, bot_token=None)
        async with (
            serve(channel_settings={"weixin": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            url = f"{srv.url}/admin/api/channels/weixin/login"
            assert (await client.post(url)).status_code == 401
            resp = await client.post(url, headers=ADMIN)
            assert resp.status_code == 202, resp.text
            body = resp.json()
            assert body["qr_url"] == "https://liteapp.weixin.qq.com/q/7GiQu1?qrcode=qr-1"
            assert "<svg" in body["qr_svg"]
            image = await client.get(f"{url}/qr.svg", headers=ADMIN)
            assert image.status_code == 200 and image.headers["content-type"].startswith("image/svg+xml")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 20
            while (status := (await client.get(url, headers=ADMIN)).json())["stored"] is None:
                assert loop.time() < deadline, status
                await asyncio.sleep(0.1)
            assert status["stored"]["status"] == "active" and status["stored"]["bot_id"] == wx.BOT_ID
            await fake.push(wx.text_message("after the dashboard login"))
            await fake.wait_until(lambda: len(fake.sent()) >= 1)
    assert fake.sent_texts() == ["You said: after the dashboard login"]
    assert fake.calls_of("sendmessage")[0].headers["Authorization"] == f"Bearer {fake.new_token}"


async def test_a_new_token_in_the_settings_resumes_after_an_expiry(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        fake.expired_tokens.add(wx.TOKEN)
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            records = ChannelRecords(srv.runtime.engine, "weixin")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 15
            while (stored := await login.load(records, "default")) is None or stored.status != "expired":
                assert loop.time() < deadline, "the expiry was not recorded"
                await asyncio.sleep(0.05)
        # A new token in the settings (another deployment, a restart) resumes the poll.
        fake.token = "bot-token-3@im.bot:0011"
        await fake.push(wx.text_message("with the new token"))
        async with serve(channel_settings={"weixin": wx_settings(fake, bot_token=fake.token)}) as srv:
            await wait_outbox_final(srv.runtime, 1)
    refused = [c for c in fake.calls_of("getupdates") if c.headers["Authorization"] == f"Bearer {wx.TOKEN}"]
    assert len(refused) == 1  # asked once with the stale token, never again
    assert fake.sent_texts() == ["You said: with the new token"]
