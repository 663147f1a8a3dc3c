"""`chatgate doctor`: App ID and App Secret checked by asking for a tenant access token."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.feishu.api import TOKEN_PATH
from channels.feishu.settings import FeishuSettings


async def probe(settings: FeishuSettings, client: httpx.AsyncClient) -> str:
    if not settings.app_id or not settings.app_secret:
        raise CredentialsRejected("FEISHU_APP_ID and FEISHU_APP_SECRET must be set")
    body = {"app_id": settings.app_id, "app_secret": settings.app_secret}
    response = await request(
        client, "tenant_access_token", "POST", settings.api_base.rstrip("/") + TOKEN_PATH, json=body
    )
    data = answer_json(response, "tenant_access_token")
    if data.get("code") != 0 or not data.get("tenant_access_token"):
        raise CredentialsRejected(
            f"tenant_access_token refused: {data.get('code')} {data.get('msg', '')}".strip()
        )
    return "tenant access token issued"
