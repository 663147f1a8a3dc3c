"""`chatgate doctor`: AppID and AppSecret checked with `stable_token`.

Always the stable endpoint, whatever WECHAT_MP_TOKEN_ENDPOINT says: the classic
`cgi-bin/token` would replace the token the running servers use.
"""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.wechat_mp.adapter import WeChatMpSettings


async def probe(settings: WeChatMpSettings, client: httpx.AsyncClient) -> str:
    if not settings.app_id or not settings.app_secret:
        raise CredentialsRejected("WECHAT_MP_APP_ID and WECHAT_MP_APP_SECRET must be set")
    body = {"grant_type": "client_credential", "appid": settings.app_id, "secret": settings.app_secret}
    response = await request(
        client, "stable_token", "POST", settings.api_base_url.rstrip("/") + "/cgi-bin/stable_token", json=body
    )
    data = answer_json(response, "stable_token")
    if data.get("errcode", 0) != 0 or not data.get("access_token"):
        raise CredentialsRejected(
            f"stable_token refused: {data.get('errcode')} {data.get('errmsg', '')}".strip()
        )
    return "access token issued"
