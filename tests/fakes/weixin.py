"""A fake iLink bot API (personal WeChat) and its CDN: a real local HTTP server.

It follows the request and response shapes of Tencent's own client package
(`@tencent-weixin/openclaw-weixin` 2.4.9, src/api/types.ts and api.ts): JSON POSTs to
`/ilink/bot/<name>` with `base_info`, bot calls authorised by `AuthorizationType:
ilink_bot_token` + `Authorization: Bearer`, `iLink-App-Id` / `iLink-App-ClientVersion`
on every request; `ret`/`errcode` -14 for a stale token; the QR login
(`get_bot_qrcode`, `get_qrcode_status`); the CDN's `/c2c/upload` (answering
`x-encrypted-param`) and `/c2c/download`.

`getupdates` works as iLink's: the cursor (`get_updates_buf`) is opaque to the client;
here it encodes how many queued messages the client has been given, so a client that
comes back with an older cursor is given the messages after it again (a redelivery).
A poll with nothing new is held up to `hold_seconds` and says so in
`longpolling_timeout_ms`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer

TOKEN = "bot-token-1@im.bot:0123456789abcdef"
BOT_ID = "b0f5860fdecb@im.bot"
OWNER = "owner@im.wechat"
APP_ID = "bot"
# uint64 message ids beyond 2**53: a client that parses them as floats gets them wrong
FIRST_ID = 7_300_000_000_000_000_001


@dataclass
class Call:
    name: str
    body: dict[str, Any]
    headers: dict[str, str]
    query: dict[str, str] = field(default_factory=dict)


def encode_cursor(n: int) -> str:
    return base64.b64encode(json.dumps({"given": n, "nonce": time.time_ns()}).encode()).decode()


def decode_cursor(buf: str) -> int:
    if not buf:
        return 0
    return int(json.loads(base64.b64decode(buf))["given"])


def text_message(
    text: str,
    *,
    sender: str = "alice@im.wechat",
    message_id: int | None = None,
    context_token: str | None = None,
    group_id: str | None = None,
    items: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A `WeixinMessage` from a person, as getupdates delivers it."""
    now = int(time.time() * 1000)
    msg: dict[str, Any] = {
        "seq": 1,
        "message_id": message_id,
        "from_user_id": sender,
        "to_user_id": BOT_ID,
        "create_time_ms": now,
        "session_id": f"session-{sender}",
        "message_type": 1,
        "message_state": 2,
        "item_list": items if items is not None else [{"type": 1, "text_item": {"text": text}}],
        "context_token": context_token or f"ctx-{sender}-{message_id}",
    }
    if group_id:
        msg["group_id"] = group_id
    return msg


class FakeILink(LocalServer):
    def __init__(self, *, token: str = TOKEN, hold_seconds: float = 1.0) -> None:
        self.token = token
        self.expired_tokens: set[str] = set()
        self.hold_seconds = hold_seconds
        self.queue: list[dict[str, Any]] = []  # every message ever queued, in order
        self.calls: list[Call] = []
        self.polls_in_flight = 0
        self.most_polls_in_flight = 0
        self.cdn: dict[str, bytes] = {}  # download param → ciphertext
        self.downloads: list[str] = []
        # QR login: the statuses get_qrcode_status answers in turn (the last repeats)
        self.qr_script: list[str] = ["wait", "scaned", "confirmed"]
        self.new_token = "bot-token-2@im.bot:fedcba9876543210"
        self.qrcodes = 0
        self._ids = itertools.count(FIRST_ID)
        self._sent_ids = itertools.count(9_100_000_000_000_000_001)
        self._changed = asyncio.Condition()

    # --- test API -------------------------------------------------------------------

    @property
    def cdn_url(self) -> str:
        return f"{self.url}/c2c"

    async def push(self, msg: dict[str, Any]) -> dict[str, Any]:
        """Queue a message (a fresh uint64 id when it has none); the next poll gives it."""
        if msg.get("message_id") is None:
            msg["message_id"] = next(self._ids)
            msg["context_token"] = msg["context_token"].replace("None", str(msg["message_id"]))
        async with self._changed:
            self.queue.append(msg)
            self._changed.notify_all()
        return msg

    def calls_of(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def sent(self) -> list[dict[str, Any]]:
        """The `msg` of every sendmessage the fake accepted."""
        return [c.body["msg"] for c in self.calls_of("sendmessage") if "refused" not in c.query]

    def sent_texts(self) -> list[str]:
        return [
            item["text_item"]["text"]
            for msg in self.sent()
            for item in msg["item_list"]
            if item.get("type") == 1
        ]

    async def wait_for(self, name: str, count: int, timeout: float = 20) -> list[Call]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.calls_of(name)) >= count), timeout)
        return self.calls_of(name)

    async def wait_until(self, check: Any, timeout: float = 20) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(check), timeout)

    def put_cdn(self, param: str, ciphertext: bytes) -> None:
        self.cdn[param] = ciphertext

    # --- the server -----------------------------------------------------------------

    async def _record(self, name: str, request: web.Request, body: dict[str, Any]) -> Call:
        call = Call(name, body, dict(request.headers), dict(request.query))
        async with self._changed:
            self.calls.append(call)
            self._changed.notify_all()
        return call

    def _auth_problem(self, request: web.Request) -> web.Response | None:
        h = request.headers
        if h.get("iLink-App-Id") != APP_ID or not h.get("iLink-App-ClientVersion", "").isdigit():
            return web.json_response({"ret": -1, "errmsg": "missing iLink-App headers"}, status=400)
        if h.get("AuthorizationType") != "ilink_bot_token" or not h.get("X-WECHAT-UIN"):
            return web.json_response({"ret": -1, "errmsg": "not a bot call"}, status=400)
        given = h.get("Authorization", "").removeprefix("Bearer ")
        if given in self.expired_tokens:
            return web.json_response({"ret": -14, "errcode": -14, "errmsg": "session timeout"})
        if given != self.token:
            return web.json_response({"ret": -1, "errcode": -1, "errmsg": "bad token"}, status=401)
        return None

    async def _bot(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = await request.json()
        if not isinstance(body.get("base_info"), dict):
            return web.json_response({"ret": -1, "errmsg": "no base_info"}, status=400)
        call = await self._record(name, request, body)
        problem = self._auth_problem(request)
        if problem is not None:
            call.query["refused"] = "1"
            return problem
        if name == "getupdates":
            return await self._getupdates(body)
        if name == "sendmessage":
            msg = body.get("msg") or {}
            if not msg.get("to_user_id") or not msg.get("item_list"):
                call.query["refused"] = "1"
                return web.json_response({"ret": -1, "errmsg": "no to_user_id or item_list"})
            return web.json_response({"ret": 0, "message_id": next(self._sent_ids)})
        if name == "getconfig":
            return web.json_response({"ret": 0, "typing_ticket": f"ticket-{body.get('ilink_user_id')}"})
        if name == "sendtyping":
            return web.json_response({"ret": 0})
        if name == "getuploadurl":
            return web.json_response({"upload_param": f"up-{body['filekey']}"})
        if name in ("msg/notifystart", "msg/notifystop"):
            return web.json_response({"ret": 0})
        return web.json_response({"ret": -1, "errmsg": "unknown"}, status=404)

    async def _getupdates(self, body: dict[str, Any]) -> web.Response:
        given = decode_cursor(str(body.get("get_updates_buf") or ""))
        self.polls_in_flight += 1
        self.most_polls_in_flight = max(self.most_polls_in_flight, self.polls_in_flight)
        try:
            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: len(self.queue) > given), self.hold_seconds
                    )
                msgs = self.queue[given:]
        finally:
            self.polls_in_flight -= 1
        return web.json_response(
            {
                "ret": 0,
                "msgs": msgs,
                "get_updates_buf": encode_cursor(given + len(msgs)),
                "longpolling_timeout_ms": int(self.hold_seconds * 1000),
            }
        )

    async def _qrcode(self, request: web.Request) -> web.Response:
        body = await request.json()
        await self._record("get_bot_qrcode", request, body)
        if request.headers.get("iLink-App-Id") != APP_ID or request.query.get("bot_type") != "3":
            return web.json_response({"ret": -1}, status=400)
        self.qrcodes += 1
        code = f"qr-{self.qrcodes}"
        return web.json_response(
            {"qrcode": code, "qrcode_img_content": f"https://liteapp.weixin.qq.com/q/7GiQu1?qrcode={code}"}
        )

    async def _qr_status(self, request: web.Request) -> web.Response:
        await self._record("get_qrcode_status", request, {})
        status = self.qr_script.pop(0) if len(self.qr_script) > 1 else self.qr_script[0]
        answer: dict[str, Any] = {"status": status}
        if status == "confirmed":
            self.token = self.new_token
            answer.update(
                bot_token=self.new_token, ilink_bot_id=BOT_ID, baseurl=self.url, ilink_user_id=OWNER
            )
        return web.json_response(answer)

    async def _upload(self, request: web.Request) -> web.Response:
        data = await request.read()
        param = request.query.get("encrypted_query_param", "")
        await self._record("cdn_upload", request, {"size": len(data)})
        if not param.startswith("up-") or not request.query.get("filekey"):
            return web.Response(status=400, headers={"x-error-message": "bad upload param"})
        download = f"dl-{request.query['filekey']}"
        self.cdn[download] = data
        return web.Response(status=200, headers={"x-encrypted-param": download})

    async def _download(self, request: web.Request) -> web.Response:
        param = request.query.get("encrypted_query_param", "")
        self.downloads.append(param)
        if param not in self.cdn:
            return web.Response(status=404, text="no such media")
        return web.Response(body=self.cdn[param], content_type="application/octet-stream")

    async def __aenter__(self) -> FakeILink:
        app = web.Application(client_max_size=50 * 1024 * 1024)
        app.router.add_post("/ilink/bot/get_bot_qrcode", self._qrcode)
        app.router.add_get("/ilink/bot/get_qrcode_status", self._qr_status)
        app.router.add_post("/ilink/bot/{name:.+}", self._bot)
        app.router.add_post("/c2c/upload", self._upload)
        app.router.add_get("/c2c/download", self._download)
        await self._serve(app, shutdown_timeout=0.5)
        return self
