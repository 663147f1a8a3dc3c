"""The DingTalk OpenAPI calls the channel makes: access token, robot sends, session webhooks.

Everything goes through the shared `httpx.AsyncClient` at `DINGTALK_API_BASE`, so a proxy
or a test double can stand in for DingTalk. Failures become the core's typed delivery
errors: the outbox retries `ChannelUnavailable`/`ChannelRateLimited` and records the rest
as failed at once.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)

TOKEN_PATH = "/v1.0/oauth2/accessToken"
GROUP_SEND_PATH = "/v1.0/robot/groupMessages/send"
SINGLE_SEND_PATH = "/v1.0/robot/oToMessages/batchSend"
DOWNLOAD_PATH = "/v1.0/robot/messageFiles/download"
TOKEN_HEADER = "x-acs-dingtalk-access-token"
# A token is renewed this long before DingTalk says it expires (it lives 7,200 s).
TOKEN_MARGIN_SECONDS = 300.0


@dataclass
class _Token:
    value: str
    renew_at: float  # monotonic


class DingTalkApi:
    """Robot sends with a cached app access token (one token request at a time)."""

    def __init__(
        self, http: httpx.AsyncClient, base: str, client_id: str, client_secret: str, *, timeout: float
    ) -> None:
        self.http = http
        self.base = base.rstrip("/")
        self.client_id = client_id
        self.client_secret = client_secret
        self.timeout = timeout
        self._token: _Token | None = None
        self._lock = asyncio.Lock()

    async def access_token(self) -> str:
        token = self._token
        if token is not None and time.monotonic() < token.renew_at:
            return token.value
        async with self._lock:
            token = self._token
            if token is not None and time.monotonic() < token.renew_at:
                return token.value
            data = await self._post(
                TOKEN_PATH, {"appKey": self.client_id, "appSecret": self.client_secret}, auth=False
            )
            value = data.get("accessToken")
            if not isinstance(value, str) or not value:
                raise ChannelUnavailable("DingTalk answered the token request without accessToken")
            try:
                lifetime = float(data.get("expireIn", 7200))
            except (TypeError, ValueError):
                lifetime = 7200.0
            margin = min(TOKEN_MARGIN_SECONDS, lifetime / 2)
            self._token = _Token(value, time.monotonic() + lifetime - margin)
            return value

    def forget_token(self, value: str) -> None:
        if self._token is not None and self._token.value == value:
            self._token = None

    async def send_text(self, *, robot_code: str, chat_id: str, group: bool, text: str) -> str | None:
        """Send `text` to a group (`openConversationId`) or one person (`userIds`); the query key."""
        return await self.send_robot(
            robot_code=robot_code, chat_id=chat_id, group=group, msg_key="sampleText", param={"content": text}
        )

    async def send_robot(
        self, *, robot_code: str, chat_id: str, group: bool, msg_key: str, param: dict[str, Any]
    ) -> str | None:
        """Send a robot message (`msg_key`: sampleText, sampleImageMsg, sampleFile …)."""
        body: dict[str, Any] = {
            "robotCode": robot_code,
            "msgKey": msg_key,
            "msgParam": json.dumps(param, ensure_ascii=False),
        }
        if group:
            body["openConversationId"] = chat_id
            path = GROUP_SEND_PATH
        else:
            body["userIds"] = [chat_id]
            path = SINGLE_SEND_PATH
        data = await self._post(path, body, auth=True)
        if not group:
            if data.get("flowControlledStaffIdList"):
                raise ChannelRateLimited(1.0, "DingTalk flow control for this user")
            if data.get("invalidStaffIdList"):
                raise ChannelRejected(f"DingTalk does not know user {chat_id!r} (invalidStaffIdList)")
        key = data.get("processQueryKey")
        return str(key) if key else None

    async def download_url(self, *, robot_code: str, download_code: str) -> str:
        """A received picture's or file's temporary URL (`messageFiles/download`)."""
        data = await self._post(
            DOWNLOAD_PATH, {"downloadCode": download_code, "robotCode": robot_code}, auth=True
        )
        url = data.get("downloadUrl")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ChannelUnavailable("DingTalk answered messageFiles/download without a downloadUrl")
        return url

    async def send_by_webhook(self, url: str, text: str) -> None:
        """Answer through a message's `sessionWebhook` (it carries its own credential)."""
        body = {"msgtype": "text", "text": {"content": text}}
        try:
            resp = await self.http.post(url, json=body, timeout=self.timeout)
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"DingTalk session webhook unreachable: {exc!r}") from exc
        data = _json(resp)
        if resp.status_code >= 400:
            raise _error(resp.status_code, data)
        errcode = data.get("errcode", 0)
        if errcode not in (0, "0"):
            raise ChannelUnavailable(
                f"DingTalk session webhook answered errcode {errcode}: {data.get('errmsg')}"
            )

    async def call(self, method: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """An OpenAPI call with the access token (cards: `POST`/`PUT /v1.0/card/…`)."""
        return await self._post(path, body, auth=True, method=method)

    async def _post(
        self, path: str, body: dict[str, Any], *, auth: bool, method: str = "POST"
    ) -> dict[str, Any]:
        for attempt in (1, 2):
            headers = {TOKEN_HEADER: await self.access_token()} if auth else {}
            try:
                resp = await self.http.request(
                    method, self.base + path, json=body, headers=headers, timeout=self.timeout
                )
            except httpx.HTTPError as exc:
                raise ChannelUnavailable(f"DingTalk unreachable: {exc!r}") from exc
            data = _json(resp)
            if auth and resp.status_code == 401 and attempt == 1:
                self.forget_token(headers[TOKEN_HEADER])  # revoked or expired early: once more
                continue
            if resp.status_code >= 400:
                raise _error(resp.status_code, data)
            return data
        raise AssertionError("unreachable")


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        data = resp.json()
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _error(status: int, data: dict[str, Any]) -> DeliveryError:
    code = data.get("code") or data.get("errcode") or "no error code"
    detail = f"DingTalk answered {status}: {code} {data.get('message') or data.get('errmsg') or ''}".strip()
    if status == 429 or "throttl" in str(code).lower():
        return ChannelRateLimited(1.0, detail)
    if status in (401, 403):
        return ChannelSendAuthError(detail)
    if status >= 500:
        return ChannelUnavailable(detail)
    return ChannelRejected(detail)
