"""`chatgate doctor`: the bot token checked with `auth.test`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.slack.settings import SlackSettings


async def probe(settings: SlackSettings, client: httpx.AsyncClient) -> str:
    if not settings.bot_token:
        raise CredentialsRejected("SLACK_BOT_TOKEN unset")
    url = settings.api_base_url.rstrip("/") + "/auth.test"
    response = await request(
        client, "auth.test", "POST", url, headers={"Authorization": f"Bearer {settings.bot_token}"}
    )
    data = answer_json(response, "auth.test")
    if not data.get("ok"):
        raise CredentialsRejected(
            f"auth.test refused the bot token: {data.get('error', response.status_code)}"
        )
    return f"auth.test: {data.get('user')} in {data.get('team')}"
