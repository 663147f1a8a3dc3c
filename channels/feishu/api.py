"""The Feishu Open API as the sender needs it: a tenant access token and JSON calls.

Every answer is `{"code": 0, "msg", …}` on success; failures carry a non-zero `code`, often
with HTTP 400 (so the body is read whatever the status). The tenant access token from
`/open-apis/auth/v3/tenant_access_token/internal` lives `expire` seconds (2 h); it is
cached and fetched anew `token_refresh_margin_seconds` before it runs out (Feishu hands a
new one out during a token's last 30 minutes), and once more when Feishu says it is no
longer valid. Failures become the core's typed delivery errors.

lark-oapi's client is not used here: its token manager fetches with blocking `requests`
calls and keeps the token in a process-global cache.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import structlog

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)
from channels.common.wechat_api import AccessTokenCache
from channels.feishu.settings import FeishuSettings

log = structlog.get_logger(__name__)

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"
# The access token is missing, invalid or expired: fetch a new one and try once more.
TOKEN_INVALID = frozenset({99991661, 99991663, 99991664, 99991668, 99991677})
RATE_LIMITED = frozenset({99991400, 11232, 230020})
# Our app's credentials or permissions: retrying cannot help.
AUTH_FAILED = frozenset({10003, 10014, 99991401, 99991672, 99991673, 99991679, 230006})
# Feishu's own trouble: try again later.
TRANSIENT = frozenset({1500, 1503, 2200, 55001, 99991650})


class FeishuApi:
    def __init__(self, http: httpx.AsyncClient, settings: FeishuSettings) -> None:
        self.http = http
        self.settings = settings
        self.base_url = settings.api_base.rstrip("/")
        self.tokens = AccessTokenCache(self._fetch_token, margin=settings.token_refresh_margin_seconds)

    async def post(self, path: str, body: dict[str, Any], params: dict[str, str] | None = None) -> Any:
        """POST with the tenant token; the answer's `data`."""
        answer = await self._authorized("POST", path, body, params)
        return answer.get("data") or {}

    async def put(self, path: str, body: dict[str, Any]) -> Any:
        """PUT with the tenant token (editing a message); the answer's `data`."""
        answer = await self._authorized("PUT", path, body, None)
        return answer.get("data") or {}

    async def patch(self, path: str, body: dict[str, Any]) -> Any:
        """PATCH with the tenant token (a card's settings); the answer's `data`."""
        answer = await self._authorized("PATCH", path, body, None)
        return answer.get("data") or {}

    async def delete(self, path: str) -> None:
        """DELETE with the tenant token (recalling a message)."""
        await self._authorized("DELETE", path, None, None)

    async def upload(self, path: str, fields: dict[str, str], file: tuple[str, bytes, str]) -> Any:
        """A multipart upload (`im/v1/images`, `im/v1/files`): `fields` and one file; the answer's `data`."""
        answer = await self._authorized("POST", path, None, None, upload=(fields, file))
        return answer.get("data") or {}

    async def get(self, path: str, *, timeout: float | None = None) -> dict[str, Any]:
        """GET with the tenant token; the whole answer (some endpoints answer beside `data`)."""
        return await self._authorized("GET", path, None, None, timeout)

    async def _authorized(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        params: dict[str, str] | None,
        timeout: float | None = None,
        *,
        upload: tuple[dict[str, str], tuple[str, bytes, str]] | None = None,
    ) -> dict[str, Any]:
        """One call with the cached token; a token Feishu refuses is replaced once."""
        for attempt in (1, 2):
            token = await self.tokens.get()
            answer = await self._request(
                method, path, token=token, body=body, params=params, timeout=timeout, upload=upload
            )
            code = _code(answer)
            if code in TOKEN_INVALID:
                self.tokens.invalidate(token)
                if attempt == 1:
                    log.info("feishu_token_refresh", code=code)
                    continue
                raise ChannelUnavailable(
                    f"{path}: a fresh tenant access token was refused too ({_describe(answer)})"
                )
            if code != 0:
                raise _error(path, answer, self.settings.rate_limit_retry_seconds)
            return answer
        raise AssertionError("unreachable")

    async def _request(
        self,
        method: str,
        path: str,
        *,
        token: str | None = None,
        body: dict[str, Any] | None = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        upload: tuple[dict[str, str], tuple[str, bytes, str]] | None = None,
    ) -> dict[str, Any]:
        headers = {} if upload else {"Content-Type": "application/json; charset=utf-8"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            if upload is not None:
                fields, file = upload
                field_name = "image" if path.endswith("/images") else "file"
                resp = await self.http.request(
                    method,
                    self.base_url + path,
                    data=fields,
                    files={field_name: file},
                    headers=headers,
                    timeout=timeout or self.settings.request_timeout_seconds,
                )
            else:
                resp = await self.http.request(
                    method,
                    self.base_url + path,
                    params=params,
                    # Chinese as UTF-8, not \u escapes: Feishu's size limits count bytes.
                    content=None if body is None else json.dumps(body, ensure_ascii=False).encode(),
                    headers=headers,
                    timeout=timeout or self.settings.request_timeout_seconds,
                )
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"{path}: {type(exc).__name__}: {exc}") from exc
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if resp.status_code == 429:
            raise ChannelRateLimited(
                _retry_after(resp, self.settings.rate_limit_retry_seconds), f"{path}: HTTP 429"
            )
        if not isinstance(answer, dict):
            if resp.status_code >= 500 or resp.status_code == 408:
                raise ChannelUnavailable(f"{path}: HTTP {resp.status_code}")
            if resp.status_code >= 400:
                raise ChannelRejected(f"{path}: HTTP {resp.status_code}: {resp.text[:200]}")
            raise ChannelUnavailable(f"{path}: the answer is not a JSON object")
        if resp.status_code >= 500 and _code(answer) == 0:
            raise ChannelUnavailable(f"{path}: HTTP {resp.status_code}")
        if _code(answer) in RATE_LIMITED:
            raise ChannelRateLimited(
                _retry_after(resp, self.settings.rate_limit_retry_seconds), f"{path}: {_describe(answer)}"
            )
        if resp.status_code >= 500 and _code(answer) not in TOKEN_INVALID:
            raise ChannelUnavailable(f"{path}: HTTP {resp.status_code}: {_describe(answer)}")
        return answer

    async def _fetch_token(self) -> tuple[str, float]:
        s = self.settings
        if not s.app_id or not s.app_secret:
            raise ChannelSendAuthError("FEISHU_APP_ID and FEISHU_APP_SECRET must be set to send")
        answer = await self._request(
            "POST", TOKEN_PATH, body={"app_id": s.app_id, "app_secret": s.app_secret}
        )
        token = answer.get("tenant_access_token")
        if _code(answer) != 0 or not isinstance(token, str) or not token:
            if _code(answer) in TRANSIENT:
                raise ChannelUnavailable(f"{TOKEN_PATH}: {_describe(answer)}")
            raise ChannelSendAuthError(f"tenant_access_token refused our credentials: {_describe(answer)}")
        log.info("feishu_token_fetched", expire=answer.get("expire"))
        return token, float(answer.get("expire") or 7200)


def _code(answer: dict[str, Any]) -> int:
    try:
        return int(answer.get("code", 0) or 0)
    except (TypeError, ValueError):
        return -1


def _describe(answer: dict[str, Any]) -> str:
    return f"code {answer.get('code')}: {str(answer.get('msg', ''))[:200]}"


def _error(path: str, answer: dict[str, Any], rate_wait: float) -> DeliveryError:
    code = _code(answer)
    detail = f"{path}: {_describe(answer)}"
    if code in RATE_LIMITED:
        return ChannelRateLimited(rate_wait, detail)
    if code in TRANSIENT or code == -1:
        return ChannelUnavailable(detail)
    if code in AUTH_FAILED:
        return ChannelSendAuthError(detail)
    # This message cannot be delivered as it is (unknown chat, bot not in it, too long …).
    return ChannelRejected(detail)


def _retry_after(resp: httpx.Response, default: float) -> float:
    for header in ("x-ogw-ratelimit-reset", "retry-after"):
        value = resp.headers.get(header)
        if value:
            try:
                return max(0.0, float(value))
            except ValueError:
                continue
    return default
