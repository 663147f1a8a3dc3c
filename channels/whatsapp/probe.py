"""`chatgate doctor`: the access token and phone number id checked with `GET /{phone-number-id}`."""

from __future__ import annotations

import httpx

from app.probe import CredentialsRejected, answer_json, request
from channels.whatsapp.settings import WhatsAppSettings


async def probe(settings: WhatsAppSettings, client: httpx.AsyncClient) -> str:
    if not settings.access_token or not settings.phone_number_id:
        raise CredentialsRejected("WHATSAPP_ACCESS_TOKEN and WHATSAPP_PHONE_NUMBER_ID must be set")
    if not settings.app_secret or not settings.verify_token:
        raise CredentialsRejected("WHATSAPP_APP_SECRET and WHATSAPP_VERIFY_TOKEN must be set")
    response = await request(
        client,
        "GET /{phone-number-id}",
        "GET",
        f"{settings.api_root}/{settings.phone_number_id}",
        params={"fields": "display_phone_number,verified_name"},
        headers={"Authorization": f"Bearer {settings.access_token}"},
    )
    data = answer_json(response, "GET /{phone-number-id}")
    error = data.get("error")
    if response.status_code >= 400 or isinstance(error, dict):
        message = error.get("message", "") if isinstance(error, dict) else ""
        raise CredentialsRejected(f"Graph API refused: {response.status_code} {message}".strip())
    return f"number {data.get('display_phone_number', '?')} ({data.get('verified_name', '?')})"
