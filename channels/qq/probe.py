"""`chatgate doctor`: AppID and AppSecret checked by asking for an app access token."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.qq.settings import QQSettings


async def probe(settings: QQSettings, client: httpx.AsyncClient) -> str:
    if not settings.app_id or not settings.app_secret:
        raise CredentialsRejected("QQ_APP_ID and QQ_APP_SECRET must be set")
    body = {"appId": settings.app_id, "clientSecret": settings.app_secret}
    response = await request(client, "getAppAccessToken", "POST", settings.token_url, json=body)
    data = answer_json(response, "getAppAccessToken")
    if not data.get("access_token"):
        raise CredentialsRejected(
            f"getAppAccessToken refused: {data.get('code')} {data.get('message', '')}".strip()
        )
    return "app access token issued"
