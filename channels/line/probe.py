"""`chatgate doctor`: the channel access token checked with `GET /v2/bot/info`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.line.settings import LineSettings


async def probe(settings: LineSettings, client: httpx.AsyncClient) -> str:
    if not settings.channel_access_token:
        raise CredentialsRejected("LINE_CHANNEL_ACCESS_TOKEN unset")
    if not settings.channel_secret:
        raise CredentialsRejected("LINE_CHANNEL_SECRET unset (webhooks cannot be verified)")
    url = f"{settings.api_base_url.rstrip('/')}/v2/bot/info"
    response = await request(
        client,
        "GET /v2/bot/info",
        "GET",
        url,
        headers={"Authorization": f"Bearer {settings.channel_access_token}"},
    )
    if response.status_code in (401, 403):
        raise CredentialsRejected(
            f"GET /v2/bot/info refused the channel access token ({response.status_code})"
        )
    data = answer_json(response, "GET /v2/bot/info")
    return f"bot {data.get('displayName', '?')} ({data.get('basicId', '?')})"
