"""The access-token HTTP API shared by WeCom and WeChat Official Accounts.

Both platforms answer HTTP 200 with a JSON `{"errcode", "errmsg", …}`; an access token
from a token endpoint is passed as `?access_token=` and lives `expires_in` seconds (7200
normally), but the platform may revoke it earlier (errcode 40014 / 42001), so a sender
refreshes once and retries. Failures become the core's typed delivery errors.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
import structlog

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)
from app.events import FilePart, ImagePart, TextPart

log = structlog.get_logger(__name__)

SYSTEM_BUSY = -1  # "系统繁忙": try again later


class AccessTokenCache:
    """One cached access token, fetched on demand; concurrent callers share one fetch.

    `fetch` returns `(token, expires_in_seconds)`. The token is used until `margin`
    seconds before it expires. `invalidate(token)` drops it only if it is still the cached
    one, so a stale failure cannot throw away a token another caller just refreshed.
    """

    def __init__(
        self,
        fetch: Callable[[], Awaitable[tuple[str, float]]],
        *,
        margin: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fetch = fetch
        self._margin = margin
        self._clock = clock
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0

    async def get(self) -> str:
        if self._valid():
            assert self._token is not None
            return self._token
        async with self._lock:
            if self._valid():
                assert self._token is not None
                return self._token
            token, expires_in = await self._fetch()
            self.fetches += 1
            lifetime = max(float(expires_in), 1.0)
            # Refresh early, but never make a short-lived token unusable.
            margin = min(self._margin, lifetime / 2)
            self._token = token
            self._expires_at = self._clock() + lifetime - margin
            return token

    def invalidate(self, token: str | None = None) -> None:
        if token is None or token == self._token:
            self._token = None
            self._expires_at = 0.0

    def _valid(self) -> bool:
        return self._token is not None and self._clock() < self._expires_at


@dataclass(frozen=True)
class Errcodes:
    """What one platform's errcodes mean for a sender (beside 0, ok, and -1, busy)."""

    token_invalid: frozenset[int]  # the access token is invalid or expired: refresh, retry once
    rate_limited: frozenset[int]
    auth_failed: frozenset[int]  # our credentials or permissions: retrying cannot help


class TokenApiSettings(Protocol):
    @property
    def api_base_url(self) -> str: ...

    @property
    def rate_limit_retry_seconds(self) -> float: ...


class TokenApi:
    """One platform's JSON API called with a cached access token.

    `post` refreshes the token once when the platform refuses it; `token_answer` reads a
    token endpoint's answer. Errcodes become the core's typed delivery errors.
    """

    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: TokenApiSettings,
        fetch_token: Callable[[], Awaitable[tuple[str, float]]],
        errcodes: Errcodes,
        *,
        channel: str,
    ) -> None:
        self.http = http
        self.base_url = settings.api_base_url.rstrip("/")
        self.tokens = AccessTokenCache(fetch_token)
        self.errcodes = errcodes
        self.rate_limit_retry_seconds = settings.rate_limit_retry_seconds
        self.channel = channel  # names the log events

    async def post(
        self,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        params: dict[str, str] | None = None,
        files: dict[str, tuple[str, bytes, str]] | None = None,
    ) -> dict[str, Any]:
        """POST JSON (or a multipart upload, `files`) with the cached token; on an
        invalid/expired token refresh once and retry."""
        url = self.base_url + path
        for attempt in (1, 2):
            token = await self.tokens.get()
            data = await call_json(
                self.http,
                "POST",
                url,
                what=path,
                params={**(params or {}), "access_token": token},
                json_body=body,
                files=files,
            )
            code = errcode_of(data)
            if code in self.errcodes.token_invalid:
                self.tokens.invalidate(token)
                if attempt == 1:
                    log.info(f"{self.channel}_token_refresh", errcode=code)
                    continue
                raise ChannelUnavailable(f"{path}: a fresh access token was refused too ({describe(data)})")
            if code != 0:
                raise self.error(path, data)
            return data
        raise AssertionError("unreachable")

    def token_answer(self, data: dict[str, Any], what: str) -> tuple[str, float]:
        """`(token, expires_in)` from a token endpoint's answer, or the error it means."""
        code = errcode_of(data)
        if code != 0 or not data.get("access_token"):
            if code in self.errcodes.rate_limited:
                raise ChannelRateLimited(self.rate_limit_retry_seconds, f"{what}: {describe(data)}")
            if code == SYSTEM_BUSY:
                raise ChannelUnavailable(f"{what}: {describe(data)}")
            raise ChannelSendAuthError(f"{what} refused our credentials: {describe(data)}")
        return str(data["access_token"]), float(data.get("expires_in") or 7200)

    def error(self, path: str, data: dict[str, Any]) -> DeliveryError:
        code = errcode_of(data)
        detail = f"{path}: {describe(data)}"
        if code in self.errcodes.rate_limited:
            return ChannelRateLimited(self.rate_limit_retry_seconds, detail)
        if code == SYSTEM_BUSY:
            return ChannelUnavailable(detail)
        if code in self.errcodes.auth_failed:
            return ChannelSendAuthError(detail)
        # Otherwise this message cannot be delivered as it is (past a reply window, quota
        # used, unknown user, too long, …).
        return ChannelRejected(detail)


async def call_json(
    http: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    what: str,
    params: dict[str, Any] | None = None,
    json_body: Any = None,
    files: dict[str, tuple[str, bytes, str]] | None = None,
) -> dict[str, Any]:
    """One API call; transport and HTTP-level failures become delivery errors.

    The caller interprets `errcode`. Network errors and 5xx are retryable, 429 is a
    rate limit, other non-2xx answers are rejections.
    """
    try:
        if files is not None:  # a multipart upload (the media APIs)
            resp = await http.request(method, url, params=params, files=files)
        elif json_body is None:
            resp = await http.request(method, url, params=params)
        else:
            # ensure_ascii=False: the platforms count Chinese text in UTF-8 bytes.
            resp = await http.request(
                method,
                url,
                params=params,
                content=json.dumps(json_body, ensure_ascii=False).encode(),
                headers={"Content-Type": "application/json; charset=utf-8"},
            )
    except httpx.HTTPError as exc:
        raise ChannelUnavailable(f"{what}: {type(exc).__name__}: {exc}") from exc
    if resp.status_code == 429:
        raise ChannelRateLimited(_retry_after(resp), f"{what}: HTTP 429")
    if resp.status_code >= 500 or resp.status_code == 408:
        raise ChannelUnavailable(f"{what}: HTTP {resp.status_code}")
    if resp.status_code >= 400:
        raise ChannelRejected(f"{what}: HTTP {resp.status_code}: {resp.text[:200]}")
    try:
        data = resp.json()
    except ValueError as exc:
        raise ChannelUnavailable(f"{what}: answer is not JSON") from exc
    if not isinstance(data, dict):
        raise ChannelUnavailable(f"{what}: answer is not a JSON object")
    return data


def errcode_of(data: dict[str, Any]) -> int:
    try:
        return int(data.get("errcode", 0) or 0)
    except (TypeError, ValueError):
        return SYSTEM_BUSY


def describe(data: dict[str, Any]) -> str:
    return f"errcode {data.get('errcode')}: {str(data.get('errmsg', ''))[:200]}"


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0


def split_utf8(text: str, max_bytes: int) -> list[str]:
    """Split `text` into pieces of at most `max_bytes` UTF-8 bytes.

    Cuts prefer a line break, then a space, in the second half of a piece; a code point
    is never cut. Joining the pieces gives back `text` exactly.
    """
    if max_bytes < 4:
        raise ValueError("max_bytes must leave room for one UTF-8 character")
    pieces: list[str] = []
    rest = text
    while len(rest.encode()) > max_bytes:
        # The longest prefix that fits, found on characters (at most max_bytes of them).
        cut = min(len(rest), max_bytes)
        while len(rest[:cut].encode()) > max_bytes:
            over = len(rest[:cut].encode()) - max_bytes
            cut -= max(1, over // 4)
        window = rest[:cut]
        for sep in ("\n", " "):
            at = window.rfind(sep)
            if at >= cut // 2:
                cut = at + 1
                break
        pieces.append(rest[:cut])
        rest = rest[cut:]
    if rest or not pieces:
        pieces.append(rest)
    return pieces


def outbound_text(parts: Iterable[Any]) -> str:
    """The text to send for a reply: its text parts, then links to any images and files.

    Sending media natively needs an upload to the platform's media API first; a link is
    what the user can open today.
    """
    lines: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            lines.append(part.text)
        elif isinstance(part, (ImagePart, FilePart)) and part.url:
            lines.append(part.url)
    return "\n".join(line for line in lines if line)
