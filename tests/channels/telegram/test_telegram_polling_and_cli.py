"""Long polling (development mode) and `chatgate channels telegram set-webhook`."""

from __future__ import annotations

import asyncio
import os
import sys

import httpx

from app.db.models import inbox
from tests.channels.support import count, inbox_keys, wait_outbox_final
from tests.channels.telegram.support import SECRET, post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import ROOT


async def test_polling_hands_updates_to_the_same_pipeline_and_confirms_them(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        await fake.push_update(tg.update(500, tg.message("polled hello")))
        settings = tg_settings(fake, mode="polling", polling_timeout_seconds=1)
        async with serve(channel_settings={"telegram": settings}) as srv:
            [call] = await fake.wait_for("sendMessage", 1)
            # A group message without a mention is confirmed but not answered.
            await fake.push_update(tg.update(501, tg.message("chatter", chat=tg.group_chat())))
            await fake.push_update(tg.update(502, tg.message("second")))
            await fake.wait_for("sendMessage", 2)
            await wait_outbox_final(srv.runtime, 2)
            assert await inbox_keys(srv.runtime) == ["telegram:4242", "telegram:4242"]
            # The next getUpdates confirms everything seen so far (offset = last id + 1).
            await fake.wait_for("getUpdates", 4)
            offsets = [c.params.get("offset") for c in fake.calls_of("getUpdates")]
            assert offsets[-1] == "503"
    assert call.params["text"] == "You said: polled hello"
    assert fake.sent_texts() == ["You said: polled hello", "You said: second"]


async def test_polling_conflict_is_reported_clearly(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        fake.always["getUpdates"] = tg.CONFLICT
        settings = tg_settings(fake, mode="polling", polling_retry_seconds=0.1, webhook_secret=None)
        async with serve(channel_settings={"telegram": settings}) as srv:
            # Without TELEGRAM_WEBHOOK_SECRET the webhook is refused as not configured.
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_update(client, srv.url, tg.update(599, tg.message("x")), secret="any")
                assert resp.status_code == 503
                assert "TELEGRAM_WEBHOOK_SECRET" in resp.json()["detail"]
            await fake.wait_for("getUpdates", 2)
            adapter = srv.runtime.adapters["telegram"]
            assert adapter.poll_error is not None
            assert "409 Conflict" in adapter.poll_error
            assert "Another process is polling" in adapter.poll_error
            # Recovery: once the other poller is gone, updates flow again.
            del fake.always["getUpdates"]
            await fake.push_update(tg.update(600, tg.message("back")))
            await fake.wait_for("sendMessage", 1)
            assert adapter.poll_error is None
            assert await count(srv.runtime, inbox) == 1


async def _chatgate(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "app",
        *args,
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()


async def test_set_webhook_command_registers_url_and_secret() -> None:
    async with FakeTelegram() as fake:
        env = {
            "TELEGRAM_BOT_TOKEN": fake.token,
            "TELEGRAM_WEBHOOK_SECRET": SECRET,
            "TELEGRAM_API_BASE_URL": fake.url,
            "TELEGRAM_FILE_BASE_URL": fake.file_url,
            "PUBLIC_BASE_URL": "https://bot.example.com/",
        }
        code, out, err = await _chatgate("channels", "telegram", "set-webhook", env=env)
        assert code == 0, err
        assert "https://bot.example.com/channels/telegram" in out
        [call] = fake.calls_of("setWebhook")
        assert call.params["url"] == "https://bot.example.com/channels/telegram"
        assert call.params["secret_token"] == SECRET

        # Without a public URL it explains what is missing instead of registering nonsense.
        code, _out, err = await _chatgate(
            "channels", "telegram", "set-webhook", env={**env, "PUBLIC_BASE_URL": ""}
        )
        assert code == 1
        assert "PUBLIC_BASE_URL" in err
        assert len(fake.calls_of("setWebhook")) == 1

        code, out, err = await _chatgate("channels", "telegram", "delete-webhook", env=env)
        assert code == 0, err
        assert len(fake.calls_of("deleteWebhook")) == 1
