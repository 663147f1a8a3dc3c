"""A secret never reaches the log, not even inside a library's message that quotes it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.logs import secret_values
from channels.telegram.settings import TelegramSettings
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import ServerProcess, stop_all
from tests.support.timing import scaled

pytestmark = pytest.mark.slow

WRONG = "123456:wrong-token-value"


async def test_a_rejected_telegram_token_is_not_echoed_into_the_log(tmp_path: Path) -> None:
    async with FakeTelegram() as fake:
        env = {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'log.db'}",
            "CHANNELS": "webhook,telegram",
            "WEBHOOK_SECRET": "w" * 20,
            "TELEGRAM_MODE": "polling",
            "TELEGRAM_BOT_TOKEN": WRONG,
            "TELEGRAM_API_BASE_URL": fake.url,
            "TELEGRAM_POLLING_RETRY_SECONDS": "0.2",
        }
        server = await asyncio.to_thread(ServerProcess(env).start)
        try:
            deadline = time.monotonic() + scaled(30)
            while "rejected by the server" not in server.log() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # the log file is the observable: nothing to wait on
            log = server.log()
        finally:
            await stop_all(server)
    assert "rejected by the server" in log, log  # python-telegram-bot's InvalidToken message
    assert WRONG not in log
    assert "The token `[redacted]` was rejected by the server." in log


def test_secret_values_of_settings_objects() -> None:
    settings = TelegramSettings(_env_file=None, bot_token=WRONG, webhook_secret="short")  # type: ignore[call-arg]
    assert secret_values(settings) == [WRONG]  # "short" is below the length that is redacted by value


async def test_the_banner_names_each_channel_with_its_credentials_and_connection(tmp_path: Path) -> None:
    from tests.fakes import telegram

    async with FakeTelegram() as fake:
        env = {
            "DATABASE_URL": f"sqlite:///{tmp_path / 'banner.db'}",
            "CHANNELS": "webhook,telegram,cron",
            "WEBHOOK_SECRET": "w" * 20,
            "TELEGRAM_MODE": "polling",
            "TELEGRAM_BOT_TOKEN": telegram.TOKEN,
            "TELEGRAM_API_BASE_URL": fake.url,
        }
        server = await asyncio.to_thread(ServerProcess(env).start)
        try:
            deadline = time.monotonic() + scaled(30)
            while "  channels:" not in server.log() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)  # printed once the server listens
            log = server.log()
        finally:
            await stop_all(server)
        bad = {**env, "DATABASE_URL": f"sqlite:///{tmp_path / 'banner2.db'}", "TELEGRAM_BOT_TOKEN": WRONG}
        refused = await asyncio.to_thread(ServerProcess(bad).start)
        try:
            deadline = time.monotonic() + scaled(30)
            while "  channels:" not in refused.log() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            refused_log = refused.log()
        finally:
            await stop_all(refused)
    line = next(li for li in log.splitlines() if li.startswith("    telegram:"))
    assert f"credentials accepted (getMe: @{fake.username})" in line, log
    assert "cron:" in log and "settings only" in log
    bad_line = next(li for li in refused_log.splitlines() if li.startswith("    telegram:"))
    assert "CREDENTIALS REFUSED: getMe refused the token: Unauthorized" in bad_line
    assert WRONG not in refused_log
