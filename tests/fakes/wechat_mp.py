"""A fake WeChat Official Account platform: the API server and the callback side.

Callbacks are built from the published rules (公众号 消息加解密说明): plaintext mode
signs `[token, timestamp, nonce]`; safe mode adds `encrypt_type=aes` and
`msg_signature` over `Encrypt`, with the AppID as receive id. The crypto is the test
package's own (`tests.fakes.wecom.WeChatPlatformCrypto`), not the adapter's.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.wecom import (
    ApiCall,
    SignedCallback,
    TokenApiFake,
    WeChatPlatformCrypto,
    cdata_xml,
    platform_signature,
)

_nonces = itertools.count(500000)


class WeChatMpCallbacks:
    def __init__(self, token: str, app_id: str, encoding_aes_key: str | None = None) -> None:
        self.token = token
        self.app_id = app_id
        self.account = "gh_test_account"
        self.crypto = WeChatPlatformCrypto(token, encoding_aes_key, app_id) if encoding_aes_key else None

    def _stamp(self, timestamp: int | None) -> tuple[str, str]:
        return str(int(time.time()) if timestamp is None else timestamp), str(next(_nonces))

    def verify_url(self, echostr: str, *, timestamp: int | None = None) -> dict[str, str]:
        ts, nonce = self._stamp(timestamp)
        return {
            "signature": platform_signature(self.token, ts, nonce),
            "timestamp": ts,
            "nonce": nonce,
            "echostr": echostr,
        }

    def plaintext(self, xml: str, *, openid: str = "", timestamp: int | None = None) -> SignedCallback:
        ts, nonce = self._stamp(timestamp)
        query = {"signature": platform_signature(self.token, ts, nonce), "timestamp": ts, "nonce": nonce}
        if openid:
            query["openid"] = openid
        return SignedCallback(query, xml.encode("utf-8"))

    def encrypted(
        self,
        xml: str,
        *,
        openid: str = "",
        timestamp: int | None = None,
        receive_id: str | None = None,
        encrypt: str | None = None,
    ) -> SignedCallback:
        assert self.crypto is not None, "safe mode needs an EncodingAESKey"
        ts, nonce = self._stamp(timestamp)
        enc = encrypt if encrypt is not None else self.crypto.seal(xml, receive_id=receive_id)
        body = (
            f"<xml><ToUserName><![CDATA[{self.account}]]></ToUserName>"
            f"<Encrypt><![CDATA[{enc}]]></Encrypt></xml>"
        )
        query = {
            "signature": platform_signature(self.token, ts, nonce),
            "timestamp": ts,
            "nonce": nonce,
            "openid": openid,
            "encrypt_type": "aes",
            "msg_signature": platform_signature(self.token, ts, nonce, enc),
        }
        return SignedCallback(query, body.encode("utf-8"))

    def text(self, openid: str, content: str, msg_id: int) -> str:
        return cdata_xml(
            {
                "ToUserName": self.account,
                "FromUserName": openid,
                "CreateTime": int(time.time()),
                "MsgType": "text",
                "Content": content,
                "MsgId": msg_id,
            }
        )

    def voice(self, openid: str, recognition: str, msg_id: int) -> str:
        return cdata_xml(
            {
                "ToUserName": self.account,
                "FromUserName": openid,
                "CreateTime": int(time.time()),
                "MsgType": "voice",
                "MediaId": "voice-media",
                "Format": "amr",
                "Recognition": recognition,
                "MsgId": msg_id,
            }
        )

    def image(self, openid: str, media_id: str, msg_id: int) -> str:
        return cdata_xml(
            {
                "ToUserName": self.account,
                "FromUserName": openid,
                "CreateTime": int(time.time()),
                "MsgType": "image",
                "PicUrl": f"http://mmbiz.qpic.cn/{media_id}",
                "MediaId": media_id,
                "MsgId": msg_id,
            }
        )

    def video(self, openid: str, media_id: str, msg_id: int, *, kind: str = "video") -> str:
        """A `video` or `shortvideo` message (`MediaId`, `ThumbMediaId`)."""
        return cdata_xml(
            {
                "ToUserName": self.account,
                "FromUserName": openid,
                "CreateTime": int(time.time()),
                "MsgType": kind,
                "MediaId": media_id,
                "ThumbMediaId": f"thumb-{media_id}",
                "MsgId": msg_id,
            }
        )

    def event(self, openid: str, event: str, create_time: int, event_key: str = "") -> str:
        return cdata_xml(
            {
                "ToUserName": self.account,
                "FromUserName": openid,
                "CreateTime": create_time,
                "MsgType": "event",
                "Event": event,
                "EventKey": event_key,
            }
        )


@dataclass
class FakeWeChatMpApi(TokenApiFake):
    """`GET /cgi-bin/token`, `POST /cgi-bin/stable_token`, `POST /cgi-bin/message/custom/send`,
    `POST /cgi-bin/message/custom/typing` (recorded in `typing`), temporary media."""

    app_id: str = "wx-test-app"
    app_secret: str = "app-secret"
    upload_answers_errcode: bool = False
    typing: list[dict[str, Any]] = field(default_factory=list)
    typed: asyncio.Event = field(default_factory=asyncio.Event)  # set by the first typing call

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/cgi-bin/token", self._token),
            web.post("/cgi-bin/stable_token", self._stable_token),
            web.post("/cgi-bin/message/custom/send", self.guarded_send),
            web.post("/cgi-bin/message/custom/typing", self._typing),
            web.get("/cgi-bin/media/get", self.media_get),
            web.post("/cgi-bin/media/upload", self.media_upload),
        ]

    async def _typing(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(ApiCall(request.path, dict(request.query), body))
        refused = self._token_error(request)
        if refused is not None:
            return refused
        self.typing.append(body)
        self.typed.set()
        return web.json_response({"errcode": 0, "errmsg": "ok"})

    def _check(self, appid: Any, secret: Any) -> dict[str, Any]:
        if appid != self.app_id:
            return {"errcode": 40013, "errmsg": "invalid appid"}
        if secret != self.app_secret:
            return {"errcode": 40125, "errmsg": "invalid appsecret"}
        return self.issue_token()

    async def _token(self, request: web.Request) -> web.Response:
        q = request.query
        self.calls.append(ApiCall(request.path, dict(q), None))
        if q.get("grant_type") != "client_credential":
            return web.json_response({"errcode": 40002, "errmsg": "invalid grant_type"})
        return web.json_response(self._check(q.get("appid"), q.get("secret")))

    async def _stable_token(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(ApiCall(request.path, dict(request.query), body))
        if body.get("grant_type") != "client_credential":
            return web.json_response({"errcode": 40002, "errmsg": "invalid grant_type"})
        data = self._check(body.get("appid"), body.get("secret"))
        if data.get("errcode") == 0:  # stable_token answers success without errcode
            data = {"access_token": data["access_token"], "expires_in": data["expires_in"]}
        return web.json_response(data)
