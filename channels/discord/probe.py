"""`chatgate doctor`: the bot token checked with `GET /users/@me`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.discord.settings import DiscordSettings


async def probe(settings: DiscordSettings, client: httpx.AsyncClient) -> str:
    if not settings.bot_token:
        raise CredentialsRejected("DISCORD_BOT_TOKEN unset")
    url = settings.api_base.rstrip("/") + "/users/@me"
    response = await request(
        client, "/users/@me", "GET", url, headers={"Authorization": f"Bot {settings.bot_token}"}
    )
    data = answer_json(response, "/users/@me")
    if response.status_code != 200:
        raise CredentialsRejected(
            f"/users/@me refused the bot token: {data.get('message', response.status_code)}"
        )
    return f"/users/@me: {data.get('username')}"
