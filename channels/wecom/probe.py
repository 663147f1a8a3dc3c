"""`chatgate doctor`: CorpID and the app's Secret checked with `gettoken`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.wecom.adapter import WeComSettings


async def probe(settings: WeComSettings, client: httpx.AsyncClient) -> str:
    if not settings.corp_id or not settings.corp_secret:
        raise CredentialsRejected("WECOM_CORP_ID and WECOM_CORP_SECRET must be set")
    params = {"corpid": settings.corp_id, "corpsecret": settings.corp_secret}
    response = await request(
        client, "gettoken", "GET", settings.api_base_url.rstrip("/") + "/cgi-bin/gettoken", params=params
    )
    data = answer_json(response, "gettoken")
    if data.get("errcode", 0) != 0 or not data.get("access_token"):
        raise CredentialsRejected(f"gettoken refused: {data.get('errcode')} {data.get('errmsg', '')}".strip())
    return "access token issued"
