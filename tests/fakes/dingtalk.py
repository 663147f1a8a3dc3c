"""A fake DingTalk: the OpenAPI over HTTP and the Stream protocol over a WebSocket.

A real local server the channel (and the official `dingtalk-stream` SDK inside it) talks
to, as it talks to api.dingtalk.com:

- `POST /v1.0/oauth2/accessToken` (`appKey`, `appSecret`) → `accessToken`, `expireIn`;
- `POST /v1.0/gateway/connections/open` (`clientId`, `clientSecret`, `subscriptions`) →
  `endpoint` (this server's WebSocket) and a one-time `ticket`;
- `GET /gateway/connect?ticket=…`: the Stream WebSocket. The fake pushes CALLBACK frames
  (topic `/v1.0/im/bot/messages/get`, or a card's button press on
  `/v1.0/card/instances/callback` built by `card_callback`; `data` a JSON string) and
  SYSTEM `ping` frames and EVENT frames (the app's event subscription, `push_event`), and
  records the ACK frames the client sends back (`{"code", "headers": {"messageId"}, …}`);
  with `redeliver_unacked`, a CALLBACK nobody ACKed (none connected, or the client died
  first) is pushed again to the next connection, as DingTalk retries unacknowledged pushes;
- `POST /v1.0/robot/groupMessages/send` and `/v1.0/robot/oToMessages/batchSend` with the
  `x-acs-dingtalk-access-token` header;
- `POST /robot/sendBySession?session=…`: a message's `sessionWebhook`;
- `POST /v1.0/robot/messageFiles/download` (`downloadCode`, `robotCode`) → `downloadUrl`,
  a temporary link to the bytes put in `files` (served at `GET /files/<code>`);
- the old OpenAPI's `POST /media/upload?access_token=…&type=image|file` (multipart `media`)
  → `media_id` (`{"errcode": 0, …}`; a token this server did not hand out is errcode 40014),
  and robot messages `sampleImageMsg` / `sampleFile` that must name an uploaded media id;
- AI cards, as the SDK's `AICardReplier` calls them: `POST /v1.0/card/instances/createAndDeliver`
  (a card in a chat, `cards`), `PUT /v1.0/card/streaming` (a streaming variable replaced
  or appended to, `isFinalize`), `PUT /v1.0/card/instances` (card data merged).

Every call is recorded, and answers can be scripted to fail. Also builds robot messages
and signs HTTP callbacks with DingTalk's published rule (independently of the adapter).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

CLIENT_ID = "dingtestclientid"
CLIENT_SECRET = "dingtalk-test-secret"
ROBOT_TOPIC = "/v1.0/im/bot/messages/get"
CARD_TOPIC = "/v1.0/card/instances/callback"
BOT_USER_ID = "$:LWCP_v1:$bot"
TOKEN_PATH = "/v1.0/oauth2/accessToken"
OPEN_PATH = "/v1.0/gateway/connections/open"
GROUP_SEND = "/v1.0/robot/groupMessages/send"
SINGLE_SEND = "/v1.0/robot/oToMessages/batchSend"
WEBHOOK_PATH = "/robot/sendBySession"
DOWNLOAD_PATH = "/v1.0/robot/messageFiles/download"
CARD_CREATE = "/v1.0/card/instances/createAndDeliver"
CARD_STREAMING = "/v1.0/card/streaming"
CARD_INSTANCES = "/v1.0/card/instances"
MEDIA_UPLOAD = "/media/upload"


@dataclass
class Upload:
    kind: str  # "image" or "file"
    name: str
    data: bytes
    content_type: str


@dataclass
class Call:
    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    query: dict[str, str]
    ok: bool = True


@dataclass
class Card:
    template: str
    space: str  # openSpaceId
    params: dict[str, Any]
    finalized: bool = False


@dataclass
class Failure:
    status: int
    code: str
    message: str = ""


SERVER_ERROR = Failure(500, "ServiceUnavailable", "the service is unavailable")
BUSY = Failure(200, "-1", "系统繁忙")  # the old OpenAPI's way to say "try again"
THROTTLED = Failure(429, "Throttling.Api", "too many requests")
NO_PERMISSION = Failure(403, "Forbidden.AccessDenied", "no permission")


@dataclass
class FakeDingTalk(LocalServer):
    client_id: str = CLIENT_ID
    client_secret: str = CLIENT_SECRET
    token_lifetime: int = 7200
    calls: list[Call] = field(default_factory=list)
    # path -> answers of its next calls, in order: a failure, or None for a normal answer
    script: dict[str, list[Failure | None]] = field(default_factory=dict)
    always: dict[str, Failure] = field(default_factory=dict)
    # Stream: ACK frames the client sent, in order
    acks: list[dict[str, Any]] = field(default_factory=list)
    tickets_used: list[str] = field(default_factory=list)
    files: dict[str, bytes] = field(default_factory=dict)  # download code -> the bytes
    cards: dict[str, Card] = field(default_factory=dict)  # outTrackId -> the card in its chat
    media: dict[str, Upload] = field(default_factory=dict)  # media_id -> what was uploaded
    url: str = ""
    redeliver_unacked: bool = False

    def __post_init__(self) -> None:
        self._changed = asyncio.Condition()
        self._tokens: list[str] = []
        self._tickets = itertools.count(1)
        self._issued_tickets: set[str] = set()
        self._sockets: list[web.WebSocketResponse] = []
        self._frame_ids = itertools.count(1)
        self._unacked: dict[str, dict[str, Any]] = {}  # CALLBACK frames by messageId

    def fail(self, path: str, *failures: Failure | None) -> None:
        self.script.setdefault(path, []).extend(failures)

    def calls_of(self, path: str) -> list[Call]:
        return [c for c in self.calls if c.path == path]

    def delivered(self) -> list[Call]:
        """Successful sends, through any of the three ways."""
        return [c for c in self.calls if c.ok and c.path in (GROUP_SEND, SINGLE_SEND, WEBHOOK_PATH)]

    @property
    def webhook_url(self) -> str:
        return f"{self.url}{WEBHOOK_PATH}?session=sess-{next(self._frame_ids)}"

    async def wait_for(self, predicate: Any, timeout: float = 15) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(predicate), scaled(timeout))

    async def wait_for_delivered(self, count: int, timeout: float = 15) -> list[Call]:
        await self.wait_for(lambda: len(self.delivered()) >= count, timeout)
        return self.delivered()

    # --- Stream mode ----------------------------------------------------------------

    @property
    def connected(self) -> int:
        return len(self._sockets)

    async def wait_for_socket(self, timeout: float = 15) -> None:
        await self.wait_for(lambda: bool(self._sockets), timeout)

    async def push_callback(
        self, data: dict[str, Any], message_id: str | None = None, *, topic: str = ROBOT_TOPIC
    ) -> str:
        """Send a robot message (or, `topic=CARD_TOPIC`, a card callback) as a CALLBACK frame
        to every connected client; its messageId."""
        message_id = message_id or f"frame-{next(self._frame_ids)}"
        frame = {
            "specVersion": "1.0",
            "type": "CALLBACK",
            "headers": {
                "appId": "app-1",
                "connectionId": "conn-1",
                "contentType": "application/json",
                "messageId": message_id,
                "time": str(int(time.time() * 1000)),
                "topic": topic,
            },
            "data": json.dumps(data, ensure_ascii=False),
        }
        self._unacked[message_id] = frame
        await self._broadcast(frame)
        return message_id

    async def push_event(self, event_type: str, data: dict[str, Any], event_id: str) -> str:
        """An event of the app's event subscription as an EVENT frame (`headers.eventType`,
        `eventId`, `data` a JSON string); its messageId. Pushed again to the next connection
        like a CALLBACK when nobody ACKed it (`redeliver_unacked`)."""
        message_id = f"event-{next(self._frame_ids)}"
        frame = {
            "specVersion": "1.0",
            "type": "EVENT",
            "headers": {
                "appId": "app-1",
                "connectionId": "conn-1",
                "contentType": "application/json",
                "messageId": message_id,
                "time": str(int(time.time() * 1000)),
                "topic": "*",
                "eventBornTime": str(int(time.time() * 1000)),
                "eventCorpId": "dingcorp",
                "eventId": event_id,
                "eventType": event_type,
                "eventUnifiedAppId": "unified-app-1",
            },
            "data": json.dumps(data, ensure_ascii=False),
        }
        self._unacked[message_id] = frame
        await self._broadcast(frame)
        return message_id

    async def push_ping(self, opaque: str) -> str:
        message_id = f"ping-{next(self._frame_ids)}"
        frame = {
            "specVersion": "1.0",
            "type": "SYSTEM",
            "headers": {
                "contentType": "application/json",
                "messageId": message_id,
                "time": str(int(time.time() * 1000)),
                "topic": "ping",
            },
            "data": json.dumps({"opaque": opaque}),
        }
        await self._broadcast(frame)
        return message_id

    async def push_disconnect(self) -> None:
        frame = {
            "specVersion": "1.0",
            "type": "SYSTEM",
            "headers": {"messageId": f"dc-{next(self._frame_ids)}", "topic": "disconnect"},
            "data": json.dumps({"reason": "server restart"}),
        }
        await self._broadcast(frame)

    def ack_for(self, message_id: str) -> dict[str, Any] | None:
        return next((a for a in self.acks if a.get("headers", {}).get("messageId") == message_id), None)

    async def wait_for_ack(self, message_id: str, timeout: float = 15) -> dict[str, Any]:
        await self.wait_for(lambda: self.ack_for(message_id) is not None, timeout)
        ack = self.ack_for(message_id)
        assert ack is not None
        return ack

    async def _broadcast(self, frame: dict[str, Any]) -> None:
        for ws in list(self._sockets):
            try:
                await ws.send_str(json.dumps(frame))
            except ConnectionError:  # a client that died: the frame stays unacked
                pass

    async def _connect(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        if ticket not in self._issued_tickets:
            return web.json_response({"code": "InvalidTicket"}, status=401)
        self._issued_tickets.discard(ticket)  # one connection per ticket
        ws = web.WebSocketResponse(autoping=True)
        await ws.prepare(request)
        async with self._changed:
            self.tickets_used.append(ticket)
            self._sockets.append(ws)
            self._changed.notify_all()
        if self.redeliver_unacked:
            for frame in list(self._unacked.values()):
                await ws.send_str(json.dumps(frame))
        try:
            async for msg in ws:
                data = json.loads(msg.data) if isinstance(msg.data, str) else {}
                async with self._changed:
                    self.acks.append(data)
                    self._unacked.pop(str((data.get("headers") or {}).get("messageId")), None)
                    self._changed.notify_all()
        finally:
            async with self._changed:
                self._sockets.remove(ws)
                self._changed.notify_all()
        return ws

    # --- OpenAPI --------------------------------------------------------------------

    async def _handle(self, request: web.Request) -> web.Response:
        path = request.path
        try:
            body = await request.json()
        except ValueError:
            body = {}
        headers = {k.lower(): v for k, v in request.headers.items()}
        failure = self._auth_failure(path, body, headers, dict(request.query))
        async with self._changed:
            if failure is None:
                scripted = self.script.get(path)
                failure = scripted.pop(0) if scripted else self.always.get(path)
            self.calls.append(Call(path, body, headers, dict(request.query), ok=failure is None))
            self._changed.notify_all()
        if failure is not None:
            return web.json_response(
                {"code": failure.code, "message": failure.message, "requestid": "req-1"},
                status=failure.status,
            )
        if path == TOKEN_PATH:
            token = f"token-{len(self._tokens) + 1}"
            self._tokens.append(token)
            return web.json_response({"accessToken": token, "expireIn": self.token_lifetime})
        if path == OPEN_PATH:
            ticket = f"ticket-{next(self._tickets)}"
            self._issued_tickets.add(ticket)
            host = request.host
            return web.json_response({"endpoint": f"ws://{host}/gateway/connect", "ticket": ticket})
        refused = self._media_refused(body) if path in (GROUP_SEND, SINGLE_SEND) else None
        if refused is not None:
            return refused
        if path == GROUP_SEND:
            return web.json_response({"processQueryKey": f"pqk-{len(self.calls)}"})
        if path == SINGLE_SEND:
            return web.json_response(
                {
                    "processQueryKey": f"pqk-{len(self.calls)}",
                    "invalidStaffIdList": [],
                    "flowControlledStaffIdList": [],
                }
            )
        if path == WEBHOOK_PATH:
            return web.json_response({"errcode": 0, "errmsg": "ok"})
        if path in (CARD_CREATE, CARD_STREAMING, CARD_INSTANCES):
            return self._card(path, body)
        if path == DOWNLOAD_PATH:
            code = str(body.get("downloadCode") or "")
            if code not in self.files:
                return web.json_response({"code": "invalidParameter.downloadCode"}, status=400)
            return web.json_response({"downloadUrl": f"http://{request.host}/files/{code}"})
        return web.json_response({"code": "NotFound"}, status=404)

    def _media_refused(self, body: dict[str, Any]) -> web.Response | None:
        """A robot image/file message must name a media id this server handed out."""
        key = body.get("msgKey")
        if key not in ("sampleImageMsg", "sampleFile"):
            return None
        param = json.loads(body.get("msgParam") or "{}")
        media_id = param.get("photoURL") if key == "sampleImageMsg" else param.get("mediaId")
        if media_id not in self.media or (key == "sampleFile" and not param.get("fileName")):
            return web.json_response({"code": "invalidParameter.msgParam", "message": "media"}, status=400)
        return None

    async def _upload(self, request: web.Request) -> web.Response:
        """The old OpenAPI: errors are HTTP 200 with a non-zero errcode."""
        query = dict(request.query)
        name, data, content_type = "", b"", ""
        async for part in await request.multipart():
            if isinstance(part, BodyPartReader) and part.name == "media":
                name, data = part.filename or "", bytes(await part.read())
                content_type = part.headers.get("Content-Type", "")
        failure: Failure | None = None
        if query.get("access_token") not in self._tokens:
            failure = Failure(200, "40014", "不合法的access_token")
        async with self._changed:
            if failure is None:
                scripted = self.script.get(MEDIA_UPLOAD)
                failure = scripted.pop(0) if scripted else self.always.get(MEDIA_UPLOAD)
            ok = failure is None and query.get("type") in ("image", "file", "voice") and bool(data)
            self.calls.append(Call(MEDIA_UPLOAD, {"name": name, "size": len(data)}, {}, query, ok=ok))
            self._changed.notify_all()
        if failure is not None:
            errcode = int(failure.code) if failure.code.lstrip("-").isdigit() else -1
            return web.json_response({"errcode": errcode, "errmsg": failure.message}, status=failure.status)
        if not ok:
            return web.json_response({"errcode": 40005, "errmsg": "不合法的文件类型"})
        media_id = f"@lAmedia{len(self.media) + 1:04d}"
        self.media[media_id] = Upload(query["type"], name, data, content_type)
        return web.json_response(
            {"errcode": 0, "errmsg": "ok", "type": query["type"], "media_id": media_id, "created_at": 1}
        )

    def _card(self, path: str, body: dict[str, Any]) -> web.Response:
        track_id = str(body.get("outTrackId") or "")
        if path == CARD_CREATE:
            space = str(body.get("openSpaceId") or "")
            if not space.startswith(("dtv1.card//IM_GROUP.", "dtv1.card//IM_ROBOT.")) or not track_id:
                return web.json_response({"code": "invalidParameter", "message": "openSpaceId"}, status=400)
            params = dict((body.get("cardData") or {}).get("cardParamMap") or {})
            self.cards[track_id] = Card(str(body.get("cardTemplateId")), space, params)
            kind, _, space_id = space.removeprefix("dtv1.card//").partition(".")
            delivered = [{"spaceType": kind, "spaceId": space_id, "success": True, "carrierId": "car-1"}]
            return web.json_response(
                {"success": True, "result": {"outTrackId": track_id, "deliverResults": delivered}}
            )
        card = self.cards.get(track_id)
        if card is None:
            return web.json_response({"code": "param.cardNotExist", "message": "card not exist"}, status=400)
        if path == CARD_STREAMING:
            key, content = str(body.get("key")), str(body.get("content") or "")
            card.params[key] = content if body.get("isFull") else str(card.params.get(key, "")) + content
            card.finalized = card.finalized or bool(body.get("isFinalize"))
        else:
            card.params.update((body.get("cardData") or {}).get("cardParamMap") or {})
        return web.json_response({"success": True, "result": True})

    async def _file(self, request: web.Request) -> web.Response:
        code = request.match_info["code"]
        async with self._changed:
            self.calls.append(Call(request.path, {}, {}, {}, ok=code in self.files))
            self._changed.notify_all()
        if code not in self.files:
            return web.Response(status=404)
        # The temporary link serves pictures as images, any other file as a download.
        data = self.files[code]
        kind = "image/png" if data.startswith(b"\x89PNG") else "application/octet-stream"
        return web.Response(body=data, content_type=kind)

    def _auth_failure(
        self, path: str, body: dict[str, Any], headers: dict[str, str], query: dict[str, str]
    ) -> Failure | None:
        if path == TOKEN_PATH:
            if (body.get("appKey"), body.get("appSecret")) != (self.client_id, self.client_secret):
                return Failure(400, "invalidClientIdOrSecret", "bad appKey or appSecret")
        elif path == OPEN_PATH:
            if (body.get("clientId"), body.get("clientSecret")) != (self.client_id, self.client_secret):
                return Failure(401, "InvalidAuthentication", "bad clientId or clientSecret")
        elif path in (GROUP_SEND, SINGLE_SEND, DOWNLOAD_PATH, CARD_CREATE, CARD_STREAMING, CARD_INSTANCES):
            if headers.get("x-acs-dingtalk-access-token") not in self._tokens:
                return Failure(401, "InvalidAuthentication", "bad access token")
            if path in (CARD_STREAMING, CARD_INSTANCES):
                return None
            if path == CARD_CREATE:
                model = body.get("imGroupOpenDeliverModel")
                if isinstance(model, dict) and model.get("robotCode") != self.client_id:
                    return Failure(400, "invalidParameter.robotCode", "robot does not exist")
                return None
            if body.get("robotCode") != self.client_id:
                return Failure(400, "invalidParameter.robotCode", "robot does not exist")
        elif path == WEBHOOK_PATH and not query.get("session"):
            return Failure(400, "invalidSession", "no session")
        return None

    async def __aenter__(self) -> FakeDingTalk:
        app = web.Application()
        app.router.add_get("/gateway/connect", self._connect)
        app.router.add_get("/files/{code}", self._file)
        app.router.add_post(MEDIA_UPLOAD, self._upload)
        app.router.add_post("/{tail:.*}", self._handle)
        app.router.add_put("/{tail:.*}", self._handle)
        await self._serve(app, shutdown_timeout=0.5)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for ws in list(self._sockets):
            await ws.close()
        await super().__aexit__(*exc)


# --- robot messages, and HTTP callbacks signed as DingTalk signs them ---------------------

_msg_ids = itertools.count(1)


def robot_message(
    text: str,
    *,
    group: bool = False,
    staff_id: str = "staff-alice",
    conversation_id: str | None = None,
    at_me: bool = True,
    webhook: str | None = None,
    webhook_expires_ms: int | None = None,
    msg_id: str | None = None,
    rich: bool = False,
    is_admin: bool = False,
) -> dict[str, Any]:
    """A robot message as DingTalk delivers it (Stream `data` or HTTP body)."""
    now_ms = int(time.time() * 1000)
    message: dict[str, Any] = {
        "conversationId": conversation_id or ("cidGROUP001==" if group else "cidSINGLE-" + staff_id),
        "chatbotCorpId": "dingcorp",
        "chatbotUserId": BOT_USER_ID,
        "msgId": msg_id or f"msg{next(_msg_ids):06d}",
        "senderNick": "Alice",
        "isAdmin": is_admin,
        "senderStaffId": staff_id,
        "sessionWebhookExpiredTime": webhook_expires_ms or now_ms + 90 * 60 * 1000,
        "createAt": now_ms,
        "senderCorpId": "dingcorp",
        "conversationType": "2" if group else "1",
        "senderId": "$:LWCP_v1:$" + staff_id,
        "robotCode": CLIENT_ID,
    }
    if webhook is not None:
        message["sessionWebhook"] = webhook
    if group:
        message["conversationTitle"] = "Team"
        message["isInAtList"] = at_me
        if at_me:
            message["atUsers"] = [{"dingtalkId": BOT_USER_ID}]
    if rich:
        message["msgtype"] = "richText"
        message["content"] = {
            "richText": [
                {"text": text},
                {"pictureDownloadCode": "pdc", "downloadCode": "dc", "type": "picture"},
            ]
        }
    else:
        message["msgtype"] = "text"
        message["text"] = {"content": (" " if group else "") + text}
    return message


def card_callback(track_id: str, user_id: str, action: str) -> dict[str, Any]:
    """A press on a card's "request" (回传请求) button as DingTalk reports it over Stream:
    the card (`outTrackId`), who pressed (`userId`) and the button's action id and params
    (`content`, a JSON string of `cardPrivateData`)."""
    content = {"cardPrivateData": {"actionIds": [action], "params": {"action": action}}}
    return {
        "extension": "{}",
        "corpId": "dingcorp",
        "type": "actionCallback",
        "userId": user_id,
        "content": json.dumps(content),
        "outTrackId": track_id,
    }


def signed_headers(*, secret: str = CLIENT_SECRET, timestamp_ms: int | None = None) -> dict[str, str]:
    """`timestamp` (ms) and `sign` = Base64(HMAC-SHA256(secret, timestamp + "\\n" + secret))."""
    ts = str(int(time.time() * 1000) if timestamp_ms is None else timestamp_ms)
    mac = hmac.new(secret.encode("utf-8"), f"{ts}\n{secret}".encode(), hashlib.sha256).digest()
    return {"Content-Type": "application/json", "timestamp": ts, "sign": base64.b64encode(mac).decode()}
