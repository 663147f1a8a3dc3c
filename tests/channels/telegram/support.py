"""Helpers of the Telegram tests: settings pointing at the fake, posting updates."""

from __future__ import annotations

import json
from typing import Any

import httpx

from channels.telegram import TelegramSettings
from tests.fakes.telegram import FakeTelegram

SECRET = "tg-secret_123"


def tg_settings(fake: FakeTelegram, **overrides: Any) -> TelegramSettings:
    values: dict[str, Any] = dict(
        bot_token=fake.token,
        webhook_secret=SECRET,
        api_base_url=fake.url,
        file_base_url=fake.file_url,
    )
    values.update(overrides)
    return TelegramSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_update(
    client: httpx.AsyncClient, base_url: str, update: dict[str, Any], *, secret: str | None = SECRET
) -> httpx.Response:
    """POST an update the way Telegram does: JSON body, the secret token header (unsigned body)."""
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    return await client.post(f"{base_url}/channels/telegram", content=json.dumps(update), headers=headers)
