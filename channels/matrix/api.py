"""The Matrix client-server API calls the channel makes, over httpx.

Plain httpx rather than an SDK (`matrix-nio`, `mautrix`): their sync loops keep the
`next_batch` token themselves (in memory or their own store), while ours must live in
the connection lease row, written only after the events reached the inbox, fenced by the
hold; the rest is a handful of JSON calls. Paths follow the spec (v1.11):
`/_matrix/client/v3/…`, media upload `/_matrix/media/v3/upload`, authenticated download
`/_matrix/client/v1/media/download/…`.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

import httpx

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
)

CLIENT = "/_matrix/client/v3"
# mxc://<server name>/<media id>: both parts limited to what the spec allows, so a URL
# built from them stays under the homeserver's media path.
_MXC = re.compile(r"^mxc://([A-Za-z0-9.:\-\[\]]+)/([A-Za-z0-9_\-]+)$")


class MatrixError(Exception):
    """The homeserver refused a call: its `errcode` and HTTP status."""

    def __init__(self, status: int, errcode: str, error: str, retry_after: float | None = None) -> None:
        super().__init__(f"{status} {errcode}: {error}")
        self.status = status
        self.errcode = errcode
        self.error = error
        self.retry_after = retry_after


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def media_url(homeserver: str, mxc: str) -> str | None:
    """The authenticated download URL of an `mxc://` URI on the bot's homeserver, or None
    for a URI that is not one."""
    found = _MXC.match(mxc)
    if found is None:
        return None
    server, media_id = found.groups()
    return f"{homeserver.rstrip('/')}/_matrix/client/v1/media/download/{q(server)}/{q(media_id)}"


class MatrixClient:
    def __init__(self, http: httpx.AsyncClient, homeserver: str, token: str, *, timeout: float) -> None:
        self.http = http
        self.homeserver = homeserver.rstrip("/")
        self.token = token
        self.timeout = timeout

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        content: bytes | None = None,
        headers: dict[str, str] | None = None,
        base: str = CLIENT,
    ) -> dict[str, Any]:
        answer = await self.http.request(
            method,
            f"{self.homeserver}{base}{path}",
            json=body if content is None else None,
            content=content,
            params=params,
            headers={**self.auth, **(headers or {})},
            timeout=timeout or self.timeout,
        )
        try:
            data = answer.json()
        except ValueError:
            data = None
        if answer.status_code >= 400 or not isinstance(data, dict):
            data = data if isinstance(data, dict) else {}
            retry = data.get("retry_after_ms")
            raise MatrixError(
                answer.status_code,
                str(data.get("errcode") or "M_UNKNOWN"),
                str(data.get("error") or answer.reason_phrase),
                retry / 1000 if isinstance(retry, int | float) else None,
            )
        return data

    async def whoami(self) -> dict[str, Any]:
        return await self.call("GET", "/account/whoami")

    async def sync(self, since: str | None, timeout: float, filter_json: str) -> dict[str, Any]:
        params = {"timeout": str(int(timeout * 1000)), "filter": filter_json}
        if since:
            params["since"] = since
        return await self.call("GET", "/sync", params=params, timeout=timeout + self.timeout)

    async def join(self, room_id: str) -> None:
        await self.call("POST", f"/join/{q(room_id)}", {})

    async def leave(self, room_id: str) -> None:
        await self.call("POST", f"/rooms/{q(room_id)}/leave", {})

    async def send(
        self, room_id: str, content: dict[str, Any], txn_id: str, kind: str = "m.room.message"
    ) -> str:
        """Send an event; the transaction id makes a retry of the same call a no-op."""
        path = f"/rooms/{q(room_id)}/send/{q(kind)}/{q(txn_id)}"
        return str((await self.call("PUT", path, content))["event_id"])

    async def redact(self, room_id: str, event_id: str, txn_id: str) -> None:
        """Redact an event (the bot's own answer); the transaction id makes a retry a no-op."""
        await self.call("PUT", f"/rooms/{q(room_id)}/redact/{q(event_id)}/{q(txn_id)}", {})

    async def typing(self, room_id: str, user_id: str, typing: bool, timeout_ms: int = 30000) -> None:
        body: dict[str, Any] = {"typing": typing}
        if typing:
            body["timeout"] = timeout_ms
        await self.call("PUT", f"/rooms/{q(room_id)}/typing/{q(user_id)}", body)

    async def messages_between(self, room_id: str, start: str, stop: str, limit: int = 100) -> dict[str, Any]:
        """A page of the room's events going back from `start` towards `stop` (a /sync
        token): what a `limited` sync timeline left out."""
        params = {"dir": "b", "from": start, "to": stop, "limit": str(limit)}
        return await self.call("GET", f"/rooms/{q(room_id)}/messages", params=params)

    async def joined_members(self, room_id: str) -> int:
        data = await self.call("GET", f"/rooms/{q(room_id)}/joined_members")
        joined = data.get("joined")
        return len(joined) if isinstance(joined, dict) else 0

    async def upload(self, data: bytes, content_type: str, filename: str) -> str:
        answer = await self.call(
            "POST",
            "/upload",
            content=data,
            params={"filename": filename},
            headers={"Content-Type": content_type},
            base="/_matrix/media/v3",
        )
        uri = answer.get("content_uri")
        if not isinstance(uri, str):
            raise MatrixError(200, "M_UNKNOWN", "upload answered without content_uri")
        return uri


def delivery_error(exc: MatrixError | httpx.HTTPError, what: str) -> Exception:
    """A failed call as the outbox's delivery errors."""
    if isinstance(exc, httpx.HTTPError):
        return ChannelUnavailable(f"Matrix {what}: homeserver unreachable ({type(exc).__name__})")
    detail = f"Matrix {what} refused: {exc}"
    if exc.status == 429 or exc.errcode == "M_LIMIT_EXCEEDED":
        return ChannelRateLimited(exc.retry_after or 1.0, detail)
    if exc.status == 401 or exc.errcode in ("M_UNKNOWN_TOKEN", "M_MISSING_TOKEN"):
        return ChannelSendAuthError(detail)
    if exc.status >= 500:
        return ChannelUnavailable(detail)
    return ChannelRejected(detail)
