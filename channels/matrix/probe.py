"""`chatgate doctor`: the bot's access token checked with `GET /_matrix/client/v3/account/whoami`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.matrix.settings import MatrixSettings

WHOAMI = "GET /_matrix/client/v3/account/whoami"


async def probe(settings: MatrixSettings, client: httpx.AsyncClient) -> str:
    if not settings.homeserver_url:
        raise CredentialsRejected("MATRIX_HOMESERVER_URL unset")
    if not settings.access_token:
        raise CredentialsRejected("MATRIX_ACCESS_TOKEN unset")
    url = f"{settings.homeserver_url.rstrip('/')}/_matrix/client/v3/account/whoami"
    response = await request(
        client, WHOAMI, "GET", url, headers={"Authorization": f"Bearer {settings.access_token}"}
    )
    if response.status_code in (401, 403):
        data = answer_json(response, WHOAMI)
        raise CredentialsRejected(
            f"{WHOAMI} refused the access token ({response.status_code} {data.get('errcode', '?')})"
        )
    data = answer_json(response, WHOAMI)
    if response.status_code != 200 or "user_id" not in data:
        raise CredentialsRejected(f"{WHOAMI} answered {response.status_code}")
    device = data.get("device_id")
    return f"bot {data['user_id']}" + (f" (device {device})" if device else "")
