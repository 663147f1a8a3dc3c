"""A fake WeCom: the API as a real local HTTP server, and the callback side that signs
and encrypts what WeCom would POST to us.

The callback crypto here is written from the published rule (企业微信 加解密方案说明),
independently of `channels.common.wechat_crypto`: PKCS#7 to 32-byte blocks is
`cryptography`'s `PKCS7(256)` padder, the signature is SHA1 of the sorted strings.
`WeChatPlatformCrypto` is shared with the Official Account fake (same crypto family).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import itertools
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled

# --- the platform's side of the callback crypto ------------------------------------------


def platform_signature(*values: str) -> str:
    """SHA1 over the dictionary-sorted, concatenated strings (the documented rule)."""
    joined = "".join(sorted(values))
    return hashlib.sha1(joined.encode("utf-8")).hexdigest()


class WeChatPlatformCrypto:
    def __init__(self, token: str, encoding_aes_key: str, receive_id: str) -> None:
        self.token = token
        self.key = base64.b64decode(encoding_aes_key + "=")
        assert len(self.key) == 32
        self.receive_id = receive_id

    def seal(self, message: str, *, receive_id: str | None = None, random16: bytes | None = None) -> str:
        body = message.encode("utf-8")
        plain = (
            (random16 or os.urandom(16))
            + len(body).to_bytes(4, "big")
            + body
            + (self.receive_id if receive_id is None else receive_id).encode("utf-8")
        )
        padder = padding.PKCS7(256).padder()  # 256 bits = the scheme's 32-byte block
        padded = padder.update(plain) + padder.finalize()
        enc = Cipher(algorithms.AES(self.key), modes.CBC(self.key[:16])).encryptor()
        return base64.b64encode(enc.update(padded) + enc.finalize()).decode("ascii")

    def open(self, encrypt: str) -> tuple[str, str]:
        """(message, receive id) of a ciphertext."""
        dec = Cipher(algorithms.AES(self.key), modes.CBC(self.key[:16])).decryptor()
        padded = dec.update(base64.b64decode(encrypt)) + dec.finalize()
        unpadder = padding.PKCS7(256).unpadder()
        plain = unpadder.update(padded) + unpadder.finalize()
        length = int.from_bytes(plain[16:20], "big")
        return plain[20 : 20 + length].decode("utf-8"), plain[20 + length :].decode("utf-8")


def cdata_xml(fields: dict[str, Any]) -> str:
    """`<xml>` with each value in CDATA (numbers bare), as the platforms send it."""
    items = []
    for name, value in fields.items():
        if isinstance(value, int):
            items.append(f"<{name}>{value}</{name}>")
        else:
            items.append(f"<{name}><![CDATA[{value}]]></{name}>")
    return "<xml>" + "".join(items) + "</xml>"


_nonces = itertools.count(100000)


@dataclass
class SignedCallback:
    query: dict[str, str]
    body: bytes


class WeComCallbacks:
    """Builds the GET/POST requests WeCom sends to an app's callback URL."""

    def __init__(self, token: str, encoding_aes_key: str, corp_id: str, agent_id: int) -> None:
        self.crypto = WeChatPlatformCrypto(token, encoding_aes_key, corp_id)
        self.corp_id = corp_id
        self.agent_id = agent_id

    def verify_url(self, echo: str, *, timestamp: int | None = None, **override: str) -> dict[str, str]:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        nonce = str(next(_nonces))
        echostr = self.crypto.seal(echo)
        query = {
            "msg_signature": platform_signature(self.crypto.token, ts, nonce, echostr),
            "timestamp": ts,
            "nonce": nonce,
            "echostr": echostr,
        }
        query.update(override)
        return query

    def post(
        self,
        inner_xml: str,
        *,
        timestamp: int | None = None,
        receive_id: str | None = None,
        encrypt: str | None = None,
        outer: str | None = None,
    ) -> SignedCallback:
        ts = str(int(time.time()) if timestamp is None else timestamp)
        nonce = str(next(_nonces))
        enc = encrypt if encrypt is not None else self.crypto.seal(inner_xml, receive_id=receive_id)
        body = (
            outer
            if outer is not None
            else (
                f"<xml><ToUserName><![CDATA[{self.corp_id}]]></ToUserName>"
                f"<AgentID><![CDATA[{self.agent_id}]]></AgentID>"
                f"<Encrypt><![CDATA[{enc}]]></Encrypt></xml>"
            )
        )
        query = {
            "msg_signature": platform_signature(self.crypto.token, ts, nonce, enc),
            "timestamp": ts,
            "nonce": nonce,
        }
        return SignedCallback(query, body.encode("utf-8"))

    def text(self, user: str, content: str, msg_id: int, *, agent_id: int | None = None) -> str:
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": int(time.time()),
                "MsgType": "text",
                "Content": content,
                "MsgId": msg_id,
                "AgentID": self.agent_id if agent_id is None else agent_id,
            }
        )

    def image(self, user: str, pic_url: str, msg_id: int, *, media_id: str = "media-1") -> str:
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": int(time.time()),
                "MsgType": "image",
                "PicUrl": pic_url,
                "MediaId": media_id,
                "MsgId": msg_id,
                "AgentID": self.agent_id,
            }
        )

    def voice(self, user: str, media_id: str, msg_id: int) -> str:
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": int(time.time()),
                "MsgType": "voice",
                "MediaId": media_id,
                "Format": "amr",
                "MsgId": msg_id,
                "AgentID": self.agent_id,
            }
        )

    def video(self, user: str, media_id: str, msg_id: int) -> str:
        """A video message (`MediaId`, `ThumbMediaId`), as WeCom documents it."""
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": int(time.time()),
                "MsgType": "video",
                "MediaId": media_id,
                "ThumbMediaId": f"thumb-{media_id}",
                "MsgId": msg_id,
                "AgentID": self.agent_id,
            }
        )

    def file(self, user: str, media_id: str, msg_id: int, *, file_name: str | None = None) -> str:
        """A file message: `MediaId` (and `FileName` when the client sends one)."""
        fields: dict[str, Any] = {
            "ToUserName": self.corp_id,
            "FromUserName": user,
            "CreateTime": int(time.time()),
            "MsgType": "file",
            "MediaId": media_id,
            "MsgId": msg_id,
            "AgentID": self.agent_id,
        }
        if file_name is not None:
            fields["FileName"] = file_name
        return cdata_xml(fields)

    def event(self, user: str, event: str, create_time: int, event_key: str = "") -> str:
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": create_time,
                "MsgType": "event",
                "Event": event,
                "EventKey": event_key,
                "AgentID": self.agent_id,
            }
        )

    def card_event(self, user: str, event_key: str, task_id: str, *, create_time: int | None = None) -> str:
        """A press on a template card button (`template_card_event`), as WeCom documents it."""
        return cdata_xml(
            {
                "ToUserName": self.corp_id,
                "FromUserName": user,
                "CreateTime": int(time.time()) if create_time is None else create_time,
                "MsgType": "event",
                "Event": "template_card_event",
                "EventKey": event_key,
                "TaskId": task_id,
                "CardType": "button_interaction",
                "ResponseCode": f"response-{task_id}",
                "AgentID": self.agent_id,
            }
        )


# --- the API server ----------------------------------------------------------------------


@dataclass
class ApiCall:
    path: str
    query: dict[str, str]
    body: Any


@dataclass
class MediaUpload:
    kind: str  # the upload's `type`
    filename: str
    content_type: str
    data: bytes


@dataclass
class TokenApiFake(LocalServer):
    """What the WeCom and Official Account fakes share: tokens, outages, a call log.

    `outage=True` (or `outage_after=n`, once n sends went through) answers sends with 503;
    `revoke_tokens(errcode)` makes every token issued so far answer `errcode` (42001
    expired, 40014 invalid) on use; `send_errcode` makes sends answer that errcode.

    Temporary media: `media[media_id] = (bytes, content type)` is what `GET
    cgi-bin/media/get` serves (an unknown id answers errcode 40007 as JSON);
    `POST cgi-bin/media/upload` records each multipart upload in `uploads` and answers
    a new media id; the first `upload_failures` uploads answer 503.
    """

    token_lifetime: int = 7200
    outage: bool = False
    outage_after: int | None = None  # an outage starts once this many sends succeeded
    send_errcode: int | None = None
    token_requests: int = 0
    calls: list[ApiCall] = field(default_factory=list)
    sent: list[ApiCall] = field(default_factory=list)
    url: str = ""
    media: dict[str, tuple[bytes, str]] = field(default_factory=dict)
    media_gets: list[str] = field(default_factory=list)
    uploads: list[MediaUpload] = field(default_factory=list)
    upload_failures: int = 0
    upload_attempts: int = 0
    upload_answers_errcode: bool = True  # WeCom answers errcode 0; the Official Account omits it
    _tokens: dict[str, int] = field(default_factory=dict)  # token -> errcode on use (0 = valid)
    _serial: itertools.count = field(default_factory=lambda: itertools.count(1))  # type: ignore[type-arg]
    _changed: asyncio.Condition = field(default_factory=asyncio.Condition)

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    def issue_token(self) -> dict[str, Any]:
        self.token_requests += 1
        token = f"token-{self.token_requests}"
        self._tokens[token] = 0
        return {"errcode": 0, "errmsg": "ok", "access_token": token, "expires_in": self.token_lifetime}

    def revoke_tokens(self, errcode: int = 42001) -> None:
        for token in self._tokens:
            self._tokens[token] = errcode

    def _token_error(self, request: web.Request) -> web.Response | None:
        state = self._tokens.get(request.query.get("access_token", ""))
        if state is None:
            return web.json_response({"errcode": 40014, "errmsg": "invalid access_token"})
        if state:
            return web.json_response({"errcode": state, "errmsg": "access_token expired or invalid"})
        return None

    async def media_get(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(ApiCall(request.path, dict(request.query), None))
        refused = self._token_error(request)
        if refused is not None:
            return refused
        media_id = request.query.get("media_id", "")
        if media_id not in self.media:
            # An error is JSON, as text/plain (so the client must look at the body).
            return web.Response(
                text='{"errcode":40007,"errmsg":"invalid media_id"}', content_type="text/plain"
            )
        self.media_gets.append(media_id)
        data, content_type = self.media[media_id]
        return web.Response(
            body=data,
            content_type=content_type,
            headers={"Content-Disposition": f'attachment; filename="{media_id}"'},
        )

    async def media_upload(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(ApiCall(request.path, dict(request.query), None))
        self.upload_attempts += 1
        if self.upload_attempts <= self.upload_failures:
            return web.Response(status=503, text="service unavailable")
        refused = self._token_error(request)
        if refused is not None:
            return refused
        kind = request.query.get("type", "")
        form = await request.post()
        media = form.get("media")
        if not isinstance(media, web.FileField):
            return web.json_response({"errcode": 41005, "errmsg": "media data missing"})
        upload = MediaUpload(kind, media.filename, media.content_type, media.file.read())
        media_id = f"uploaded-{len(self.uploads) + 1}"
        async with self._changed:
            self.uploads.append(upload)
            self._changed.notify_all()
        answer: dict[str, Any] = {"type": kind, "media_id": media_id, "created_at": str(int(time.time()))}
        if self.upload_answers_errcode:
            answer = {"errcode": 0, "errmsg": "ok", **answer}
        return web.json_response(answer)

    @property
    def send_attempts(self) -> int:
        return sum(1 for c in self.calls if "send" in c.path)

    async def guarded_send(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        call = ApiCall(request.path, dict(request.query), body)
        async with self._changed:
            self.calls.append(call)
            self._changed.notify_all()
        if self.outage or (self.outage_after is not None and len(self.sent) >= self.outage_after):
            return web.Response(status=503, text="service unavailable")
        token = request.query.get("access_token", "")
        state = self._tokens.get(token)
        if state is None:
            return web.json_response({"errcode": 40014, "errmsg": "invalid access_token"})
        if state:
            return web.json_response({"errcode": state, "errmsg": "access_token expired or invalid"})
        if self.send_errcode is not None:
            return web.json_response({"errcode": self.send_errcode, "errmsg": "scripted failure"})
        async with self._changed:
            self.sent.append(call)
            self._changed.notify_all()
        return web.json_response({"errcode": 0, "errmsg": "ok", "msgid": f"msg-{next(self._serial)}"})

    async def wait_for_sent(self, count: int, timeout: float = 15) -> list[ApiCall]:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: len(self.sent) >= count), scaled(timeout))
        return list(self.sent)

    async def wait_for_uploads(self, count: int, timeout: float = 15) -> list[MediaUpload]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.uploads) >= count), scaled(timeout)
            )
        return list(self.uploads)

    async def wait_for_attempts(self, count: int, timeout: float = 15) -> None:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: self.send_attempts >= count), scaled(timeout)
            )

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.add_routes(self.routes())
        await self._serve(app)
        return self


@dataclass
class FakeWeComApi(TokenApiFake):
    """`GET /cgi-bin/gettoken`, `POST /cgi-bin/message/send`, `POST /cgi-bin/appchat/send`."""

    corp_id: str = "ww-test-corp"
    corp_secret: str = "corp-secret"

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/cgi-bin/gettoken", self._gettoken),
            web.post("/cgi-bin/message/send", self._message_send),
            web.post("/cgi-bin/appchat/send", self.guarded_send),
            web.get("/cgi-bin/media/get", self.media_get),
            web.post("/cgi-bin/media/upload", self.media_upload),
        ]

    refuse_template_cards: bool = False  # answer template cards errcode 40058
    task_ids: set[str] = field(default_factory=set)

    async def _message_send(self, request: web.Request) -> web.StreamResponse:
        """`message/send`, a `template_card` checked as WeCom documents a `button_interaction`
        card: `task_id` (digits, letters, `_-@`, at most 128 bytes, unique per app), a
        `main_title.title`, 1 to 6 buttons each with `text` and a `key` of at most 1024 bytes."""
        body = await request.json()
        if isinstance(body, dict) and body.get("msgtype") == "template_card":
            problem = self._card_problem(body.get("template_card"))
            if problem or self.refuse_template_cards:
                self.calls.append(ApiCall(request.path, dict(request.query), body))
                return web.json_response({"errcode": 40058, "errmsg": problem or "scripted refusal"})
        return await self.guarded_send(request)

    def _card_problem(self, card: Any) -> str | None:
        if not isinstance(card, dict) or card.get("card_type") != "button_interaction":
            return "only button_interaction cards are modelled"
        task = card.get("task_id")
        if not isinstance(task, str) or not re.fullmatch(r"[0-9A-Za-z_\-@]{1,128}", task):
            return "invalid task_id"
        if task in self.task_ids:
            return "task_id already used"
        title = card.get("main_title")
        if not isinstance(title, dict) or not title.get("title"):
            return "main_title.title is required"
        buttons = card.get("button_list")
        if not isinstance(buttons, list) or not 1 <= len(buttons) <= 6:
            return "button_list needs 1 to 6 buttons"
        for button in buttons:
            key = button.get("key") if isinstance(button, dict) else None
            if not isinstance(key, str) or not key or len(key.encode()) > 1024 or not button.get("text"):
                return "a button needs text and a key of at most 1024 bytes"
        self.task_ids.add(task)
        return None

    async def _gettoken(self, request: web.Request) -> web.Response:
        q = request.query
        self.calls.append(ApiCall(request.path, dict(q), None))
        if q.get("corpid") != self.corp_id:
            return web.json_response({"errcode": 40013, "errmsg": "invalid corpid"})
        if q.get("corpsecret") != self.corp_secret:
            return web.json_response({"errcode": 40001, "errmsg": "invalid credential"})
        return web.json_response(self.issue_token())
