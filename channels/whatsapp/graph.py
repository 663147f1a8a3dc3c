"""The few Graph API calls the channel makes, and their errors as the outbox's.

`POST /{phone-number-id}/messages` sends; `GET /{media-id}` gives a short-lived URL that
is fetched with the same bearer token. Graph errors are `{"error": {"code", "message",
…}}`; the codes below are the Cloud API's published ones.
"""

from __future__ import annotations

from typing import Any

import httpx

from app.errors import (
    ChannelNotConfigured,
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
)
from app.fetch import GuardedFetcher
from channels.common.media import Media, MediaTooLarge, download_capped
from channels.whatsapp.settings import WhatsAppSettings

# Throttling: app/account rate limits, spam rate limit, pair rate limit, cloud throughput.
_RATE_LIMIT_CODES = {4, 80007, 130429, 131048, 131056}
_TOKEN_CODES = {190}  # the access token expired or was revoked
REENGAGEMENT_CODE = 131047  # "more than 24 hours have passed since the recipient last replied"


class OutsideWindow(ChannelRejected):
    """The platform refused a free-form message: the customer-service window is closed."""


class GraphAPI:
    def __init__(self, http: httpx.AsyncClient, fetcher: GuardedFetcher, settings: WhatsAppSettings) -> None:
        self.http = http
        self.fetcher = fetcher  # the media URL comes from an answer: fetched guarded (`app.fetch`)
        self.settings = settings

    def headers(self) -> dict[str, str]:
        if not self.settings.access_token or not self.settings.phone_number_id:
            raise ChannelNotConfigured("WHATSAPP_ACCESS_TOKEN and WHATSAPP_PHONE_NUMBER_ID must be set")
        return {"Authorization": f"Bearer {self.settings.access_token}"}

    async def send(self, body: dict[str, Any]) -> str | None:
        """Send one message (or a status: read, typing); its `wamid`."""
        headers = self.headers()
        url = f"{self.settings.api_root}/{self.settings.phone_number_id}/messages"
        try:
            resp = await self.http.post(
                url,
                json={"messaging_product": "whatsapp", **body},
                headers=headers,
                timeout=self.settings.api_timeout_seconds,
            )
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"Graph API unreachable: {type(exc).__name__}") from exc
        data = checked(resp, "messages")
        sent = data.get("messages")
        if isinstance(sent, list) and sent and isinstance(sent[0], dict) and sent[0].get("id"):
            return str(sent[0]["id"])
        return None

    async def media(self, media_id: str, limit: int) -> Media:
        """Download a media object by id: its URL first, then the bytes (within `limit`)."""
        headers = self.headers()
        try:
            resp = await self.http.get(
                f"{self.settings.api_root}/{media_id}",
                headers=headers,
                timeout=self.settings.api_timeout_seconds,
            )
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"Graph API unreachable: {type(exc).__name__}") from exc
        info = checked(resp, "media")
        url = info.get("url")
        if not isinstance(url, str) or not url:
            raise ChannelRejected(f"media {media_id} has no url")
        size = info.get("file_size")
        if isinstance(size, int) and size > limit:
            raise MediaTooLarge(limit)
        # The URL is Meta's CDN; a Graph API base the operator configured (a proxy, a test
        # double) may serve it on a private address.
        media = await download_capped(
            self.fetcher, url, limit, headers=headers, trusted=[self.settings.graph_base_url]
        )
        mime = info.get("mime_type")
        return Media(media.data, mime if isinstance(mime, str) and mime else media.content_type)


def checked(resp: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON object of a successful answer; a typed `DeliveryError` otherwise."""
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.is_success and isinstance(data, dict):
        return data
    error = data.get("error") if isinstance(data, dict) else None
    error = error if isinstance(error, dict) else {}
    code = error.get("code")
    detail = f"Graph API {what} answered {resp.status_code}"
    if error:
        detail += f": {code} {error.get('message', '')}".rstrip()
    if resp.status_code == 429 or code in _RATE_LIMIT_CODES:
        raise ChannelRateLimited(_retry_after(resp), detail)
    if resp.status_code >= 500 or resp.status_code == 408:
        raise ChannelUnavailable(detail)
    if resp.status_code == 401 or code in _TOKEN_CODES:
        raise ChannelSendAuthError(detail)
    if code == REENGAGEMENT_CODE:
        raise OutsideWindow(detail)
    raise ChannelRejected(detail)


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(1.0, float(resp.headers.get("retry-after", "")))
    except ValueError:
        return 60.0  # Graph names no delay; its limits are per minute or longer


async def upload(api: GraphAPI, data: bytes, mime_type: str, name: str) -> str:
    """Upload media for an answer (`POST /{phone-number-id}/media`); its media id."""
    headers = api.headers()
    try:
        resp = await api.http.post(
            f"{api.settings.api_root}/{api.settings.phone_number_id}/media",
            data={"messaging_product": "whatsapp", "type": mime_type},
            files={"file": (name, data, mime_type)},
            headers=headers,
            timeout=api.settings.api_timeout_seconds,
        )
    except httpx.HTTPError as exc:
        raise ChannelUnavailable(f"Graph API unreachable: {type(exc).__name__}") from exc
    media_id = checked(resp, "media upload").get("id")
    if not media_id:
        raise ChannelRejected("the media upload returned no id")
    return str(media_id)
