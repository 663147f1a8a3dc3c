"""`chatgate doctor`: the bot token checked with `getMe`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.telegram.settings import TelegramSettings


async def probe(settings: TelegramSettings, client: httpx.AsyncClient) -> str:
    if not settings.bot_token:
        raise CredentialsRejected("TELEGRAM_BOT_TOKEN unset")
    response = await request(client, "getMe", "GET", f"{settings.api_base_url}{settings.bot_token}/getMe")
    data = answer_json(response, "getMe")
    if not data.get("ok"):
        # The token is part of the URL: name only Telegram's own description.
        raise CredentialsRejected(f"getMe refused the token: {data.get('description', response.status_code)}")
    return f"getMe: @{data['result'].get('username')}"
