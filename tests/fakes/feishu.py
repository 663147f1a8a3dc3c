"""A fake Feishu Open API.

The server is a real local HTTP server answering like open.feishu.cn: the tenant access
token endpoint (tokens that really expire), `bot/v3/info`, sending a message to a chat and
replying to a message, editing a text message (`PUT`, at most 20 edits, as documented),
uploading images and files (multipart), serving message resources (`resources`), streaming
cards (CardKit: a card entity created, sent as an interactive message, its markdown
element's content replaced, its settings patched or the whole card replaced, with growing
`sequence` numbers and streaming mode that closes by itself after `card_streaming_seconds`), with
Feishu's `{"code", "msg", "data"}` answers, its `uuid` dedup, and scriptable failures.
Every call is recorded; `texts` is what each sent text message shows now.

The event callbacks Feishu sends, signed and encrypted, are built in `feishu_events`; its
names are re-exported here, so tests use one module (`from tests.fakes import feishu as fs`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from tests.fakes.feishu_events import (
    APP_ID,
    APP_SECRET,
    BOT_OPEN_ID,
    ENCRYPT_KEY,
    TENANT_KEY,
    VERIFICATION_TOKEN,
    bot_mention,
    callback,
    card_action_event,
    encrypt,
    group_mention,
    message_event,
    reaction_event,
    recall_event,
    sign,
    text_event,
    url_verification,
)
from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

# The callbacks' builders and identities live in `feishu_events`; tests reach them here too.
__all__ = [
    "APP_ID",
    "APP_SECRET",
    "BOT_NOT_IN_CHAT",
    "BOT_OPEN_ID",
    "ENCRYPT_KEY",
    "NO_PERMISSION",
    "RATE_LIMITED",
    "SERVER_ERROR",
    "TENANT_KEY",
    "TOKEN_INVALID",
    "TOKEN_PATH",
    "VERIFICATION_TOKEN",
    "Call",
    "Card",
    "Failure",
    "FakeFeishu",
    "bot_mention",
    "callback",
    "card_action_event",
    "encrypt",
    "group_mention",
    "message_event",
    "reaction_event",
    "recall_event",
    "sign",
    "text_event",
    "url_verification",
]

TOKEN_PATH = "/open-apis/auth/v3/tenant_access_token/internal"


@dataclass
class Call:
    kind: str  # "token", "bot_info", "create", "reply", "update", "image", "file", "resource"
    path: str
    params: dict[str, str]
    body: dict[str, Any]
    headers: dict[str, str]
    ok: bool = True
    size: int = 0  # bytes of the request body

    @property
    def token(self) -> str:
        return self.headers.get("authorization", "").removeprefix("Bearer ")

    @property
    def text(self) -> str:
        return str(json.loads(self.body["content"])["text"])


@dataclass
class Failure:
    status: int
    code: int
    msg: str
    headers: dict[str, str] = field(default_factory=dict)


SERVER_ERROR = Failure(500, 1500, "internal error")
RATE_LIMITED = Failure(429, 99991400, "request trigger frequency limit", {"x-ogw-ratelimit-reset": "1"})
BOT_NOT_IN_CHAT = Failure(400, 230002, "The bot is not in the chat.")
NO_PERMISSION = Failure(400, 99991672, "Access denied. One of the following scopes is required")
TOKEN_INVALID = Failure(400, 99991663, "Invalid access token for authorization.")


@dataclass
class Card:
    """A card entity (CardKit) and what it shows."""

    elements: dict[str, str]  # element_id -> markdown content
    streaming: bool
    created: float  # monotonic
    sequence: int = 0
    messages: list[str] = field(default_factory=list)  # interactive messages showing it

    @property
    def text(self) -> str:
        return "".join(self.elements.values())


@dataclass
class FakeFeishu(LocalServer):
    app_id: str = APP_ID
    app_secret: str = APP_SECRET
    bot_open_id: str = BOT_OPEN_ID
    token_lifetime: int = 7200  # `expire` of the tokens handed out, in seconds
    calls: list[Call] = field(default_factory=list)
    # kind -> answers of its next calls, in order: a failure, or None for a normal answer
    script: dict[str, list[Failure | None]] = field(default_factory=dict)
    always: dict[str, Failure] = field(default_factory=dict)
    url: str = ""
    texts: dict[str, str] = field(default_factory=dict)  # message id -> the text it shows now
    edits: dict[str, int] = field(default_factory=dict)  # message id -> times edited
    uploads: dict[str, tuple[str, bytes, dict[str, str]]] = field(default_factory=dict)  # key -> file
    resources: dict[str, bytes] = field(default_factory=dict)  # file_key -> bytes of a message resource
    cards: dict[str, Card] = field(default_factory=dict)  # card_id -> the card entity
    recalled: set[str] = field(default_factory=set)  # message ids
    card_streaming_seconds: float = 600.0  # Feishu closes a card's streaming mode after 10 minutes
    # chat_id -> (owner open_id, manager open_ids), served by GET im/v1/chats/:chat_id
    chats: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    p2p_chats: set[str] = field(default_factory=set)  # chats GET im/v1/chats/:chat_id calls p2p
    # message id -> what GET im/v1/messages/:id says of a message the bot did not send
    # (chat_id, root_id …; sender: the user's open_id); the bot's own are remembered.
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._tokens: dict[str, float] = {}  # token -> monotonic expiry
        self._token_ids = itertools.count(1)
        self._message_ids = itertools.count(1)
        self._by_uuid: dict[str, str] = {}
        self._sent: set[str] = set()

    def fail(self, kind: str, *failures: Failure | None) -> None:
        self.script.setdefault(kind, []).extend(failures)

    def revoke_tokens(self) -> None:
        self._tokens.clear()

    def calls_of(self, *kinds: str) -> list[Call]:
        return [c for c in self.calls if c.kind in kinds]

    def delivered(self) -> list[Call]:
        """Messages Feishu accepted (failed attempts excluded), sent or replies."""
        return [c for c in self.calls_of("create", "reply") if c.ok]

    async def wait_for(self, count: int, *kinds: str, timeout: float = 15) -> list[Call]:
        kinds = kinds or ("create", "reply")
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.calls_of(*kinds)) >= count), scaled(timeout)
            )
        return self.calls_of(*kinds)

    async def _record(self, call: Call) -> None:
        async with self._changed:
            self.calls.append(call)
            self._changed.notify_all()

    def _failure(self, kind: str) -> Failure | None:
        scripted = self.script.get(kind)
        return scripted.pop(0) if scripted else self.always.get(kind)

    async def _token(self, request: web.Request) -> web.Response:
        body = await request.json()
        call = Call("token", request.path, dict(request.query), body, _headers(request))
        failure = self._failure("token")
        if failure is None and (body.get("app_id"), body.get("app_secret")) != (self.app_id, self.app_secret):
            failure = Failure(400, 10014, "app secret invalid")
        call.ok = failure is None
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        token = f"t-{next(self._token_ids):04d}"
        self._tokens[token] = time.monotonic() + self.token_lifetime
        return web.json_response(
            {"code": 0, "msg": "ok", "tenant_access_token": token, "expire": self.token_lifetime}
        )

    def _auth_failure(self, request: web.Request) -> Failure | None:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        expires = self._tokens.get(token)
        if expires is None:
            return TOKEN_INVALID
        if time.monotonic() >= expires:
            return Failure(400, 99991677, "Authentication token expired.")
        return None

    async def _chat_info(self, request: web.Request) -> web.Response:
        failure = self._auth_failure(request) or self._failure("chat_info")
        params = dict(request.query)
        await self._record(Call("chat_info", request.path, params, {}, _headers(request), ok=failure is None))
        if failure is not None:
            return _fail(failure)
        chat_id = request.match_info["chat_id"]
        if chat_id in self.p2p_chats:
            data = {
                "chat_id": chat_id,
                "chat_mode": "p2p",
                "user_manager_id_list": [],
                "bot_manager_id_list": [],
            }
            return web.json_response({"code": 0, "msg": "success", "data": data})
        if chat_id not in self.chats:
            return web.json_response({"code": 232011, "msg": "chat not found"}, status=400)
        owner, managers = self.chats[chat_id]
        id_type = params.get("user_id_type", "open_id")
        data = {
            "chat_id": chat_id,
            "name": "Team",
            "chat_mode": "group",
            "owner_id": owner,
            "owner_id_type": id_type,
            "user_manager_id_list": managers,
            "bot_manager_id_list": [],
        }
        return web.json_response({"code": 0, "msg": "success", "data": data})

    async def _bot_info(self, request: web.Request) -> web.Response:
        failure = self._auth_failure(request) or self._failure("bot_info")
        await self._record(Call("bot_info", request.path, {}, {}, _headers(request), ok=failure is None))
        if failure is not None:
            return _fail(failure)
        bot = {"activate_status": 2, "app_name": "chatgate", "open_id": self.bot_open_id}
        return web.json_response({"code": 0, "msg": "ok", "bot": bot})

    async def _send(self, request: web.Request) -> web.Response:
        replied = request.match_info.get("message_id")
        kind = "reply" if replied else "create"
        raw = await request.read()
        body = json.loads(raw)
        call = Call(kind, request.path, dict(request.query), body, _headers(request), size=len(raw))
        failure = self._auth_failure(request) or self._failure(kind)
        if failure is None and kind == "create" and request.query.get("receive_id_type") != "chat_id":
            failure = Failure(400, 99992402, "field validation failed: receive_id_type")
        card_id = _card_reference(body)
        if failure is None and card_id is not None and card_id not in self.cards:
            failure = Failure(400, 230099, "Failed to create card content: card not exist")
        call.ok = failure is None
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        uuid = body.get("uuid")
        duplicate = isinstance(uuid, str) and uuid in self._by_uuid
        message_id = self._by_uuid[uuid] if duplicate else f"om_sent{next(self._message_ids):04d}"
        if isinstance(uuid, str):
            self._by_uuid[uuid] = message_id
        self._sent.add(message_id)
        if body.get("msg_type") == "text" and not duplicate:
            self.texts[message_id] = str(json.loads(body["content"])["text"])
        if card_id is not None and not duplicate:
            self.cards[card_id].messages.append(message_id)
        data: dict[str, Any] = {
            "message_id": message_id,
            "chat_id": body.get("receive_id") or "oc_from_reply",
            "msg_type": body.get("msg_type"),
            "body": {"content": body.get("content")},
            "sender": {"id": self.app_id, "id_type": "app_id", "sender_type": "app"},
        }
        if replied:
            parent = self._known(replied)
            data["chat_id"] = parent.get("chat_id", "oc_from_reply")
            data["parent_id"] = replied
            data["root_id"] = parent.get("root_id") or replied
        if not duplicate:
            self.messages[message_id] = {
                k: v for k, v in data.items() if k in ("chat_id", "root_id", "parent_id", "msg_type")
            }
        return web.json_response({"code": 0, "msg": "success", "data": data})

    def _known(self, message_id: str) -> dict[str, Any]:
        return self.messages.get(message_id, {})

    async def _get_message(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        failure = self._auth_failure(request) or self._failure("get")
        if failure is None and message_id not in self._sent:
            # A message someone else sent: Feishu names its sender as a user.
            sender = {"id": "ou_someone", "id_type": "open_id", "sender_type": "user"}
        else:
            sender = {"id": self.app_id, "id_type": "app_id", "sender_type": "app"}
        await self._record(Call("get", request.path, {}, {}, _headers(request), ok=failure is None))
        if failure is not None:
            return _fail(failure)
        known = dict(self._known(message_id))
        if isinstance(known.get("sender"), str):  # a user's message the test described
            sender = {"id": known.pop("sender"), "id_type": "open_id", "sender_type": "user"}
        item = {"message_id": message_id, "msg_type": "text", **known}
        item["sender"] = {**sender, "tenant_key": TENANT_KEY}
        return web.json_response({"code": 0, "msg": "success", "data": {"items": [item]}})

    async def _update(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        body = await request.json()
        call = Call("update", request.path, {}, body, _headers(request))
        failure = self._auth_failure(request) or self._failure("update")
        if failure is None and message_id not in self.texts:
            failure = Failure(400, 230001, "Your request contains an invalid request parameter, message_id.")
        elif failure is None and body.get("msg_type") != "text":
            failure = Failure(400, 230001, "msg_type does not match the message")
        elif failure is None and self.edits.get(message_id, 0) >= 20:
            failure = Failure(400, 230072, "The message has reached the number of times it can be edited.")
        call.ok = failure is None
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        self.edits[message_id] = self.edits.get(message_id, 0) + 1
        self.texts[message_id] = str(json.loads(body["content"])["text"])
        return web.json_response({"code": 0, "msg": "success", "data": {"message_id": message_id}})

    async def _recall(self, request: web.Request) -> web.Response:
        message_id = request.match_info["message_id"]
        failure = self._auth_failure(request) or self._failure("recall")
        if failure is None and (message_id not in self._sent or message_id in self.recalled):
            failure = Failure(400, 230011, "The message was recalled.")
        await self._record(Call("recall", request.path, {}, {}, _headers(request), ok=failure is None))
        if failure is not None:
            return _fail(failure)
        self.recalled.add(message_id)
        self.texts.pop(message_id, None)
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _upload(self, request: web.Request) -> web.Response:
        kind = "image" if request.path.endswith("/images") else "file"
        fields: dict[str, str] = {}
        name, data = "", b""
        async for part in await request.multipart():
            if not isinstance(part, BodyPartReader):
                continue
            if part.name in ("image", "file") and part.filename is not None:
                name, data = part.filename, bytes(await part.read())
            elif part.name:
                fields[part.name] = await part.text()
        call = Call(kind, request.path, {}, dict(fields), _headers(request), size=len(data))
        failure = self._auth_failure(request) or self._failure(kind)
        if failure is None and not data:
            failure = Failure(400, 234001, "Invalid request param: no file")
        call.ok = failure is None
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        key = f"{'img_v3' if kind == 'image' else 'file_v3'}_{next(self._message_ids):04d}"
        self.uploads[key] = (name, data, fields)
        return web.json_response({"code": 0, "msg": "success", "data": {f"{kind}_key": key}})

    async def _resource(self, request: web.Request) -> web.Response:
        key = request.match_info["file_key"]
        failure = self._auth_failure(request) or self._failure("resource")
        if failure is None and request.query.get("type") not in ("image", "file"):
            failure = Failure(400, 234001, "Invalid request param: type")
        if failure is None and key not in self.resources:
            failure = Failure(400, 234003, "File not in msg.")
        call = Call("resource", request.path, dict(request.query), {}, _headers(request), ok=failure is None)
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        # Images come back as what they are; files as a download (octet-stream, with the name).
        if request.query["type"] == "image":
            return web.Response(body=self.resources[key], content_type="image/png")
        headers = {"Content-Disposition": f'attachment; filename="{key}"'}
        return web.Response(
            body=self.resources[key], content_type="application/octet-stream", headers=headers
        )

    # --- CardKit ----------------------------------------------------------------------------

    def card_shown(self, message_id: str) -> Card | None:
        return next((c for c in self.cards.values() if message_id in c.messages), None)

    async def _card_call(
        self, request: web.Request, kind: str
    ) -> tuple[Call, dict[str, Any], Failure | None]:
        body = await request.json()
        call = Call(kind, request.path, {}, body, _headers(request))
        return call, body, self._auth_failure(request) or self._failure(kind)

    async def _card_create(self, request: web.Request) -> web.Response:
        call, body, failure = await self._card_call(request, "card_create")
        card = None
        if failure is None:
            card = _parse_card(body)
            if card is None:
                failure = Failure(400, 300301, "invalid card json: schema 2.0 with element ids expected")
        call.ok = failure is None
        await self._record(call)
        if failure is not None or card is None:
            return _fail(failure or SERVER_ERROR)
        card_id = f"7{next(self._message_ids):018d}"
        self.cards[card_id] = card
        return web.json_response({"code": 0, "msg": "success", "data": {"card_id": card_id}})

    def _card_failure(self, card_id: str, body: dict[str, Any], *, needs_streaming: bool) -> Failure | None:
        card = self.cards.get(card_id)
        if card is None:
            return Failure(400, 300302, "card not found")
        if card.streaming and time.monotonic() - card.created > self.card_streaming_seconds:
            card.streaming = False  # closed by Feishu after its time
        sequence = body.get("sequence")
        if not isinstance(sequence, int) or sequence <= card.sequence:
            return Failure(400, 300317, "sequence number compare failed")
        if needs_streaming and not card.streaming:
            return Failure(400, 300309, "streaming mode is closed")
        return None

    async def _card_content(self, request: web.Request) -> web.Response:
        call, body, failure = await self._card_call(request, "card_content")
        card_id, element_id = request.match_info["card_id"], request.match_info["element_id"]
        failure = failure or self._card_failure(card_id, body, needs_streaming=True)
        if failure is None and element_id not in self.cards[card_id].elements:
            failure = Failure(400, 300303, "element not found")
        if failure is None and not isinstance(body.get("content"), str):
            failure = Failure(400, 99992402, "field validation failed: content")
        call.ok = failure is None
        await self._record(call)
        if failure is not None:
            return _fail(failure)
        card = self.cards[card_id]
        card.sequence = body["sequence"]
        card.elements[element_id] = body["content"]
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _card_settings(self, request: web.Request) -> web.Response:
        call, body, failure = await self._card_call(request, "card_settings")
        card_id = request.match_info["card_id"]
        failure = failure or self._card_failure(card_id, body, needs_streaming=False)
        settings = json.loads(body["settings"]) if isinstance(body.get("settings"), str) else None
        if failure is None and not isinstance(settings, dict):
            failure = Failure(400, 99992402, "field validation failed: settings")
        call.ok = failure is None
        await self._record(call)
        if failure is not None or not isinstance(settings, dict):
            return _fail(failure or SERVER_ERROR)
        card = self.cards[card_id]
        card.sequence = body["sequence"]
        config = settings.get("config")
        if isinstance(config, dict) and "streaming_mode" in config:
            card.streaming = bool(config["streaming_mode"])
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def _card_update(self, request: web.Request) -> web.Response:
        call, body, failure = await self._card_call(request, "card_update")
        card_id = request.match_info["card_id"]
        failure = failure or self._card_failure(card_id, body, needs_streaming=False)
        new = _parse_card(body.get("card") or {}) if failure is None else None
        if failure is None and new is None:
            failure = Failure(400, 300301, "invalid card json")
        call.ok = failure is None
        await self._record(call)
        if failure is not None or new is None:
            return _fail(failure or SERVER_ERROR)
        card = self.cards[card_id]
        card.sequence, card.elements, card.streaming = body["sequence"], new.elements, new.streaming
        return web.json_response({"code": 0, "msg": "success", "data": {}})

    async def __aenter__(self) -> FakeFeishu:
        app = web.Application()
        app.router.add_post(TOKEN_PATH, self._token)
        app.router.add_get("/open-apis/bot/v3/info", self._bot_info)
        app.router.add_get("/open-apis/im/v1/chats/{chat_id}", self._chat_info)
        app.router.add_post("/open-apis/im/v1/messages", self._send)
        app.router.add_post("/open-apis/im/v1/messages/{message_id}/reply", self._send)
        app.router.add_get("/open-apis/im/v1/messages/{message_id}", self._get_message)
        app.router.add_put("/open-apis/im/v1/messages/{message_id}", self._update)
        app.router.add_delete("/open-apis/im/v1/messages/{message_id}", self._recall)
        app.router.add_post("/open-apis/im/v1/images", self._upload)
        app.router.add_post("/open-apis/im/v1/files", self._upload)
        app.router.add_get("/open-apis/im/v1/messages/{message_id}/resources/{file_key}", self._resource)
        app.router.add_post("/open-apis/cardkit/v1/cards", self._card_create)
        app.router.add_put("/open-apis/cardkit/v1/cards/{card_id}", self._card_update)
        app.router.add_patch("/open-apis/cardkit/v1/cards/{card_id}/settings", self._card_settings)
        app.router.add_put(
            "/open-apis/cardkit/v1/cards/{card_id}/elements/{element_id}/content", self._card_content
        )
        await self._serve(app, shutdown_timeout=0.5)
        return self


def _headers(request: web.Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def _card_reference(body: dict[str, Any]) -> str | None:
    """The card id an interactive message shows (`{"type": "card", "data": {"card_id"}}`)."""
    if body.get("msg_type") != "interactive":
        return None
    content = json.loads(body.get("content") or "{}")
    data = content.get("data") if content.get("type") == "card" else None
    card_id = data.get("card_id") if isinstance(data, dict) else None
    return str(card_id) if card_id else None


def _parse_card(body: dict[str, Any]) -> Card | None:
    """A card entity from `{"type": "card_json", "data": <card JSON 2.0 as a string>}`."""
    if body.get("type") != "card_json" or not isinstance(body.get("data"), str):
        return None
    card = json.loads(body["data"])
    if card.get("schema") != "2.0":
        return None
    elements = (card.get("body") or {}).get("elements") or []
    shown = {
        str(e["element_id"]): str(e.get("content", ""))
        for e in elements
        if isinstance(e, dict) and e.get("element_id") and e.get("tag") in ("markdown", "plain_text")
    }
    if not shown:
        return None
    streaming = bool((card.get("config") or {}).get("streaming_mode"))
    return Card(elements=shown, streaming=streaming, created=time.monotonic())


def _fail(failure: Failure) -> web.Response:
    return web.json_response(
        {"code": failure.code, "msg": failure.msg}, status=failure.status, headers=failure.headers
    )
