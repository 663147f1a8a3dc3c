"""`chatgate doctor`: Client ID and Client Secret checked by asking for an access token."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.dingtalk.openapi import TOKEN_PATH
from channels.dingtalk.settings import DingTalkSettings


async def probe(settings: DingTalkSettings, client: httpx.AsyncClient) -> str:
    if not settings.client_id or not settings.client_secret:
        raise CredentialsRejected("DINGTALK_CLIENT_ID and DINGTALK_CLIENT_SECRET must be set")
    body = {"appKey": settings.client_id, "appSecret": settings.client_secret}
    response = await request(
        client, "oauth2/accessToken", "POST", settings.api_base.rstrip("/") + TOKEN_PATH, json=body
    )
    data = answer_json(response, "oauth2/accessToken")
    if response.status_code != 200 or not data.get("accessToken"):
        raise CredentialsRejected(
            f"oauth2/accessToken refused: {data.get('code')} {data.get('message', '')}".strip()
        )
    return "access token issued"
