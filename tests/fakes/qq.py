"""A fake of the QQ bot platform, written from its published documentation.

* `QQPlatform` is a real HTTP server playing the token endpoint
  (`POST /app/getAppAccessToken`) and the OpenAPI message endpoints
  (`POST /v2/users/{openid}/messages`, `POST /v2/groups/{group_openid}/messages`); it
  checks `Authorization: QQBot <token>`, refuses a repeated `(msg_id, msg_seq)` pair like
  the platform does, and records what it accepted.
* `signed_headers` signs a callback the way the platform does: Ed25519 over
  `timestamp + body`, with the seed made by repeating the bot secret to 32 bytes.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled


def key_from_secret(secret: str) -> Ed25519PrivateKey:
    seed = secret
    while len(seed) < 32:  # "repeat the secret until 32 bytes" (the docs' Go sample)
        seed = seed * 2
    return Ed25519PrivateKey.from_private_bytes(seed[:32].encode())


def signature(secret: str, message: bytes) -> str:
    return key_from_secret(secret).sign(message).hex()


def signed_headers(
    secret: str, body: bytes, *, timestamp: int | None = None, app_id: str | None = None
) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "QQBot-Callback",
        "X-Signature-Method": "Ed25519",
        "X-Signature-Timestamp": ts,
        "X-Signature-Ed25519": signature(secret, ts.encode() + body),
    }
    if app_id is not None:
        headers["X-Bot-Appid"] = app_id
    return headers


_ids = itertools.count(1)


def c2c_message(
    user_openid: str,
    content: str,
    *,
    message_id: str | None = None,
    attachments: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    n = next(_ids)
    return {
        "op": 0,
        "id": f"C2C_MESSAGE_CREATE:evt{n}",
        "t": "C2C_MESSAGE_CREATE",
        "s": n,
        "d": {
            "id": message_id or f"ROBOT1.0_msg{n}",
            "author": {"id": user_openid, "user_openid": user_openid, "union_openid": user_openid},
            "content": content,
            "timestamp": "2026-12-02T12:00:00+08:00",
            "attachments": attachments or [],
        },
    }


def interaction(
    button_data: str,
    *,
    user_openid: str | None = None,
    group_openid: str | None = None,
    member_openid: str | None = None,
    interaction_id: str | None = None,
) -> dict[str, Any]:
    """An `INTERACTION_CREATE` callback: a press of a message-keyboard callback button, in a
    private chat (`user_openid`) or a group (`group_openid`, `member_openid`), as documented."""
    n = next(_ids)
    d: dict[str, Any] = {
        "id": interaction_id or f"interaction-{n}",
        "type": 11,
        "chat_type": 2 if user_openid else 1,
        "scene": "c2c" if user_openid else "group",
        "timestamp": "2026-12-02T12:00:00+08:00",
        "data": {
            "type": 11,
            "resolved": {"button_data": button_data, "button_id": button_data.split(":")[0]},
        },
        "version": 1,
    }
    if user_openid:
        d["user_openid"] = user_openid
    else:
        d["group_openid"], d["group_member_openid"] = group_openid, member_openid
    return {"op": 0, "id": f"INTERACTION_CREATE:evt{n}", "t": "INTERACTION_CREATE", "s": n, "d": d}


def group_at_message(
    group_openid: str, member_openid: str, content: str, *, message_id: str | None = None
) -> dict[str, Any]:
    n = next(_ids)
    return {
        "op": 0,
        "id": f"GROUP_AT_MESSAGE_CREATE:evt{n}",
        "t": "GROUP_AT_MESSAGE_CREATE",
        "s": n,
        "d": {
            "id": message_id or f"ROBOT1.0_grp{n}",
            "author": {"id": member_openid, "member_openid": member_openid},
            "content": content,
            "group_id": group_openid,
            "group_openid": group_openid,
            "timestamp": "2026-12-02T12:00:00+08:00",
            "attachments": [],
        },
    }


@dataclass
class SentMessage:
    path: str
    authorization: str
    body: dict[str, Any]


class QQPlatform(LocalServer):
    """Token endpoint and message API. `fail_first` answers 500 to that many message calls
    (-1: all of them)."""

    def __init__(
        self,
        app_id: str,
        secret: str,
        *,
        fail_first: int = 0,
        expires_in: int = 7200,
        fail_at: frozenset[int] = frozenset(),
        lose_answer_at: frozenset[int] = frozenset(),
    ) -> None:
        self.app_id = app_id
        self.secret = secret
        self.fail_first = fail_first
        self.fail_at = fail_at  # message attempts answered 500 without accepting the message
        self.lose_answer_at = lose_answer_at  # attempts whose message is accepted, answered 500
        self.expires_in = expires_in
        self.token_requests = 0
        self.message_attempts = 0
        self.valid_tokens: set[str] = set()
        self.sent: list[SentMessage] = []
        self.uploads: list[SentMessage] = []
        self.refuse_markdown = False  # answer markdown messages 400, as for a bot without the permission
        self.interactions: list[SentMessage] = []  # PUT /interactions/{id}: button presses answered
        self.upload_failures = 0  # the first uploads answered 500
        self.upload_attempts = 0
        self._seen_seq: set[tuple[str, int]] = set()
        self._changed = asyncio.Condition()

    @property
    def token_url(self) -> str:
        return f"{self.url}/app/getAppAccessToken"

    def revoke_tokens(self) -> None:
        self.valid_tokens.clear()

    async def _token(self, request: web.Request) -> web.Response:
        self.token_requests += 1
        body = await request.json()
        if body.get("appId") != self.app_id or body.get("clientSecret") != self.secret:
            return web.json_response({"code": 100016, "message": "invalid appid or secret"})
        token = f"token-{self.token_requests}"
        self.valid_tokens.add(token)
        return web.json_response({"access_token": token, "expires_in": str(self.expires_in)})

    async def _message(self, request: web.Request) -> web.Response:
        self.message_attempts += 1
        auth = request.headers.get("Authorization", "")
        if not auth.startswith("QQBot ") or auth.removeprefix("QQBot ") not in self.valid_tokens:
            return web.json_response({"code": 11244, "message": "token not exist or expire"}, status=401)
        if (
            self.fail_first < 0
            or self.message_attempts <= self.fail_first
            or self.message_attempts in self.fail_at
        ):
            return web.json_response({"code": 500000, "message": "internal error"}, status=500)
        body = await request.json()
        if self.refuse_markdown and body.get("msg_type") == 2:
            return web.json_response({"code": 304003, "message": "markdown not allowed"}, status=400)
        if "msg_id" in body:
            pair = (body["msg_id"], int(body.get("msg_seq", 1)))
            if pair in self._seen_seq:
                return web.json_response({"code": 40054005, "message": "消息被去重"}, status=400)
            self._seen_seq.add(pair)
        async with self._changed:
            self.sent.append(SentMessage(request.path, auth, body))
            self._changed.notify_all()
        if self.message_attempts in self.lose_answer_at:
            return web.json_response({"code": 500000, "message": "gateway timeout"}, status=500)
        return web.json_response({"id": f"sent-{len(self.sent)}", "timestamp": int(time.time())})

    async def _upload(self, request: web.Request) -> web.Response:
        self.upload_attempts += 1
        if self.upload_attempts <= self.upload_failures:
            return web.json_response({"code": 500000, "message": "internal error"}, status=500)
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("QQBot ") not in self.valid_tokens:
            return web.json_response({"code": 11244, "message": "token not exist or expire"}, status=401)
        body = await request.json()
        if body.get("file_type") not in (1, 2, 3, 4) or not (body.get("url") or body.get("file_data")):
            return web.json_response({"code": 40034001, "message": "invalid file"}, status=400)
        self.uploads.append(SentMessage(request.path, auth, body))
        n = len(self.uploads)
        return web.json_response({"file_uuid": f"uuid-{n}", "file_info": f"file-info-{n}", "ttl": 3600})

    async def _interaction(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth.removeprefix("QQBot ") not in self.valid_tokens:
            return web.json_response({"code": 11244, "message": "token not exist or expire"}, status=401)
        body = await request.json()
        if body.get("code") not in (0, 1, 2, 3, 4, 5):
            return web.json_response({"code": 40034002, "message": "invalid code"}, status=400)
        async with self._changed:
            self.interactions.append(SentMessage(request.path, auth, body))
            self._changed.notify_all()
        return web.Response(status=204)  # "成功返回空"

    async def wait_for(self, count: int, timeout: float = 15) -> list[SentMessage]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.sent) >= count), scaled(timeout))
        return list(self.sent)

    async def __aenter__(self) -> QQPlatform:
        app = web.Application()
        app.router.add_post("/app/getAppAccessToken", self._token)
        app.router.add_post("/v2/users/{openid}/messages", self._message)
        app.router.add_post("/v2/groups/{group_openid}/messages", self._message)
        app.router.add_post("/v2/users/{openid}/files", self._upload)
        app.router.add_post("/v2/groups/{group_openid}/files", self._upload)
        app.router.add_put("/interactions/{interaction_id}", self._interaction)
        await self._serve(app)
        return self
