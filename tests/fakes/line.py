"""A fake LINE Messaging API, written from its published reference.

* `FakeLine` is a real HTTP server playing `api.line.me` and `api-data.line.me`:
  `POST /v2/bot/message/reply` (a reply token is single use and expires),
  `POST /v2/bot/message/push` (`X-Line-Retry-Key`: a key seen before answers 409),
  `POST /v2/bot/chat/loading/start` (users only), `GET /v2/bot/info`, the group and room
  member profiles (`GET /v2/bot/group/{id}/member/{user}`, `…/room/…`) and
  `GET /v2/bot/message/{id}/content`. It checks `Authorization: Bearer <token>`, refuses
  more than five messages or a text over 5,000 characters like LINE does, records what
  it accepted, and can be scripted to fail.
* `signature` signs a body the published way: base64 of HMAC-SHA256 with the channel secret.
* `message_event`, `native_event` build webhook events as LINE sends them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.local_server import LocalServer

ACCESS_TOKEN = "line-channel-access-token"
SECRET = "8c570fa6dd201bb328f1c1eac23a96d8"
BOT_USER_ID = "Ubot0000000000000000000000000000"
TOKEN_LIFETIME = 60.0  # LINE: use a reply token within about a minute


def signature(secret: str, body: bytes) -> str:
    return base64.b64encode(hmac.new(secret.encode(), body, hashlib.sha256).digest()).decode()


def signed_headers(secret: str, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json; charset=utf-8", "X-Line-Signature": signature(secret, body)}


def webhook_body(*events: dict[str, Any]) -> bytes:
    return json.dumps({"destination": BOT_USER_ID, "events": list(events)}, ensure_ascii=False).encode()


_ids = itertools.count(1)


def _source(user: str, group: str | None, room: str | None) -> dict[str, Any]:
    if group:
        return {"type": "group", "groupId": group, "userId": user}
    if room:
        return {"type": "room", "roomId": room, "userId": user}
    return {"type": "user", "userId": user}


def message_event(
    message: dict[str, Any],
    *,
    user: str,
    reply_token: str,
    group: str | None = None,
    room: str | None = None,
    timestamp_ms: int | None = None,
    event_id: str | None = None,
    redelivery: bool = False,
) -> dict[str, Any]:
    return {
        "type": "message",
        "mode": "active",
        "timestamp": int(time.time() * 1000) if timestamp_ms is None else timestamp_ms,
        "source": _source(user, group, room),
        "webhookEventId": event_id or f"01HEVENT{next(_ids):018d}",
        "deliveryContext": {"isRedelivery": redelivery},
        "replyToken": reply_token,
        "message": message,
    }


def text_message(text: str, *, mention_bot: bool = False) -> dict[str, Any]:
    n = next(_ids)
    message: dict[str, Any] = {
        "type": "text",
        "id": f"{46800000000000 + n}",
        "quoteToken": f"q{n}",
        "text": text,
    }
    if mention_bot:
        message["text"] = f"@gate {text}"
        message["mention"] = {
            "mentionees": [{"index": 0, "length": 5, "type": "user", "userId": BOT_USER_ID, "isSelf": True}]
        }
    return message


def image_message(message_id: str) -> dict[str, Any]:
    return {"type": "image", "id": message_id, "quoteToken": "qimg", "contentProvider": {"type": "line"}}


def native_event(
    kind: str,
    *,
    user: str | None,
    group: str | None = None,
    room: str | None = None,
    reply_token: str | None = None,
    event_id: str | None = None,
    **body: Any,
) -> dict[str, Any]:
    """A webhook event other than a message (`unsend`, `postback`, `memberJoined`,
    `memberLeft`), with its own fields in `body` as the reference shows them."""
    source = _source(user or "", group, room)
    if user is None:
        source.pop("userId", None)
    event: dict[str, Any] = {
        "type": kind,
        "mode": "active",
        "timestamp": int(time.time() * 1000),
        "source": source,
        "webhookEventId": event_id or f"01HEVENT{next(_ids):018d}",
        "deliveryContext": {"isRedelivery": False},
        **body,
    }
    if reply_token is not None:
        event["replyToken"] = reply_token
    return event


def _template_error(m: dict[str, Any]) -> str | None:
    """LINE's limits on a confirm template (the only template chatgate sends)."""
    template = m.get("template")
    alt = m.get("altText")
    if not isinstance(alt, str) or not 1 <= len(alt) <= 400:
        return "The property, 'altText', in the request body is invalid"
    if not isinstance(template, dict) or template.get("type") != "confirm":
        return "The property, 'template', in the request body is invalid"
    text, actions = template.get("text"), template.get("actions")
    if not isinstance(text, str) or not 1 <= len(text) <= 240:
        return "The property, 'template.text', in the request body is invalid"
    if not isinstance(actions, list) or len(actions) != 2:
        return "The property, 'template.actions', in the request body is invalid"
    for action in actions:
        if action.get("type") != "postback" or not 1 <= len(str(action.get("data", ""))) <= 300:
            return "The property, 'template.actions', in the request body is invalid"
        if not 1 <= len(str(action.get("label", ""))) <= 20:
            return "The property, 'template.actions.label', in the request body is invalid"
    return None


@dataclass
class Sent:
    path: str
    body: dict[str, Any]
    retry_key: str | None = None
    ids: list[str] = field(default_factory=list)  # the sent messages' ids, as LINE answered them


class FakeLine(LocalServer):
    def __init__(self, access_token: str = ACCESS_TOKEN) -> None:
        self.access_token = access_token
        self.sent: list[Sent] = []  # accepted replies and pushes, in order
        self.loading: list[dict[str, Any]] = []  # accepted loading animations
        self.loaded = asyncio.Event()  # set by the first one
        self.refused: list[tuple[str, int]] = []  # (path, status) of every refused call
        self.contents: dict[str, bytes] = {}  # message id → content served by the data API
        self.content_requests: list[str] = []
        self.members: dict[tuple[str, str], str] = {}  # (group or room, user) → display name
        # path → answers to its next calls before it works again: a status, or (status, message)
        self.fail_next: dict[str, list[int | tuple[int, str]]] = {}
        self._tokens: dict[str, float] = {}  # reply token → issued at (monotonic)
        self._retry_keys: dict[str, list[dict[str, str]]] = {}
        self._changed = asyncio.Condition()

    # --- test API -------------------------------------------------------------------

    def reply_token(self, *, age: float = 0.0) -> str:
        """A reply token as a webhook would carry it, issued `age` seconds ago."""
        token = uuid.uuid4().hex
        self._tokens[token] = time.monotonic() - age
        return token

    @property
    def data_url(self) -> str:
        return self.url  # the fake plays both hosts

    def texts(self) -> list[str]:
        return [m["text"] for s in self.sent for m in s.body["messages"] if m["type"] == "text"]

    async def wait_for(self, count: int, timeout: float = 20) -> list[Sent]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.sent) >= count), timeout)
        return list(self.sent)

    async def wait_for_loading(self, count: int, timeout: float = 20) -> list[dict[str, Any]]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.loading) >= count), timeout)
        return list(self.loading)

    # --- the API --------------------------------------------------------------------

    def _refuse(self, request: web.Request, status: int, message: str) -> web.Response:
        self.refused.append((request.path, status))
        return web.json_response({"message": message}, status=status)

    def _check(self, request: web.Request) -> web.Response | None:
        if request.headers.get("Authorization") != f"Bearer {self.access_token}":
            return self._refuse(
                request, 401, "Authentication failed. Confirm that the access token is valid."
            )
        script = self.fail_next.get(request.path)
        if script:
            failure = script.pop(0)
            status, message = failure if isinstance(failure, tuple) else (failure, "scripted failure")
            return self._refuse(request, status, message)
        return None

    def _messages_error(self, body: Any) -> str | None:
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not 1 <= len(messages) <= 5:
            return "Size must be between 1 and 5"
        for m in messages:
            if m.get("type") == "image":
                urls = (m.get("originalContentUrl"), m.get("previewImageUrl"))
                if not all(isinstance(u, str) and u.startswith("https://") for u in urls):
                    return "The property, 'originalContentUrl', in the request body is invalid"
                continue
            if m.get("type") == "template":
                if (error := _template_error(m)) is not None:
                    return error
                continue
            if m.get("type") != "text" or not isinstance(m.get("text"), str) or not m["text"]:
                return "The property, 'text', in the request body is invalid"
            if len(m["text"].encode("utf-16-le")) // 2 > 5000:
                return "Length must be between 0 and 5000"
        return None

    async def _accept(self, sent: Sent) -> list[dict[str, str]]:
        async with self._changed:
            self.sent.append(sent)
            self._changed.notify_all()
        n = len(self.sent)
        answer = [
            {"id": f"5{n:05d}{i}", "quoteToken": f"sq{n}{i}"} for i in range(len(sent.body["messages"]))
        ]
        sent.ids = [m["id"] for m in answer]
        return answer

    async def _reply(self, request: web.Request) -> web.Response:
        if (failed := self._check(request)) is not None:
            return failed
        body = await request.json()
        if (error := self._messages_error(body)) is not None:
            return self._refuse(request, 400, error)
        issued = self._tokens.pop(body.get("replyToken", ""), None)  # single use
        if issued is None or time.monotonic() - issued > TOKEN_LIFETIME:
            return self._refuse(request, 400, "Invalid reply token")
        sent = await self._accept(Sent(request.path, body))
        return web.json_response({"sentMessages": sent})

    async def _push(self, request: web.Request) -> web.Response:
        if (failed := self._check(request)) is not None:
            return failed
        body = await request.json()
        if (error := self._messages_error(body)) is not None:
            return self._refuse(request, 400, error)
        if not isinstance(body.get("to"), str) or body["to"][:1] not in ("U", "C", "R"):
            return self._refuse(request, 400, "The property, 'to', in the request body is invalid")
        key = request.headers.get("X-Line-Retry-Key")
        if key is not None and key in self._retry_keys:
            self.refused.append((request.path, 409))
            return web.json_response(
                {"message": "The retry key is already accepted", "sentMessages": self._retry_keys[key]},
                status=409,
            )
        sent = await self._accept(Sent(request.path, body, key))
        if key is not None:
            self._retry_keys[key] = sent
        return web.json_response({"sentMessages": sent})

    async def _loading(self, request: web.Request) -> web.Response:
        if (failed := self._check(request)) is not None:
            return failed
        body = await request.json()
        seconds = body.get("loadingSeconds", 20)
        if not str(body.get("chatId", "")).startswith("U") or seconds % 5 or not 5 <= seconds <= 60:
            return self._refuse(request, 400, "The request body has 1 error(s)")
        async with self._changed:
            self.loading.append(body)
            self.loaded.set()
            self._changed.notify_all()
        return web.json_response({}, status=202)

    async def _bot_info(self, request: web.Request) -> web.Response:
        if (failed := self._check(request)) is not None:
            return failed
        return web.json_response(
            {
                "userId": BOT_USER_ID,
                "basicId": "@123abcde",
                "displayName": "gate",
                "chatMode": "bot",
                "markAsReadMode": "auto",
            }
        )

    async def _member(self, request: web.Request) -> web.Response:
        if (failed := self._check(request)) is not None:
            return failed
        chat, user = request.match_info["chat"], request.match_info["user"]
        name = self.members.get((chat, user))
        if name is None:  # not a member (any more), or no consent to share the profile
            return self._refuse(request, 404, "Not found")
        return web.json_response({"displayName": name, "userId": user, "pictureUrl": "https://example.com/p"})

    async def _content(self, request: web.Request) -> web.StreamResponse:
        if (failed := self._check(request)) is not None:
            return failed
        message_id = request.match_info["message_id"]
        self.content_requests.append(message_id)
        data = self.contents.get(message_id)
        if data is None:
            return self._refuse(request, 404, "Not found")
        return web.Response(body=data, content_type="image/jpeg")

    async def __aenter__(self) -> FakeLine:
        app = web.Application()
        app.router.add_post("/v2/bot/message/reply", self._reply)
        app.router.add_post("/v2/bot/message/push", self._push)
        app.router.add_post("/v2/bot/chat/loading/start", self._loading)
        app.router.add_get("/v2/bot/info", self._bot_info)
        app.router.add_get("/v2/bot/group/{chat}/member/{user}", self._member)
        app.router.add_get("/v2/bot/room/{chat}/member/{user}", self._member)
        app.router.add_get("/v2/bot/message/{message_id}/content", self._content)
        await self._serve(app)
        return self
