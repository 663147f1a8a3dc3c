"""The iLink bot API as Tencent's own client speaks it (`@tencent-weixin/openclaw-weixin`).

JSON over HTTP POST to `{base}/ilink/bot/<name>`, every body with a `base_info`
(`channel_version`, `bot_agent`), every request with `iLink-App-Id`,
`iLink-App-ClientVersion` (uint32 `0x00MMNNPP`), and the bot calls with
`AuthorizationType: ilink_bot_token`, `Authorization: Bearer <bot token>` and a random
`X-WECHAT-UIN` (base64 of a random uint32 in decimal). Answers carry `ret` and, on
failure, `errcode`/`errmsg`; errcode (or ret) -14 means the bot token went stale and a
new QR login is needed (`SessionExpired`).

Message ids are uint64 on the wire; Python's JSON parser keeps them exact, and we carry
them as strings.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass
from typing import Any

import httpx

STALE_TOKEN_ERRCODE = -14

# proto enums (api/types.ts)
MESSAGE_TYPE_USER, MESSAGE_TYPE_BOT = 1, 2
MESSAGE_STATE_FINISH = 2
ITEM_TEXT, ITEM_IMAGE, ITEM_VOICE, ITEM_FILE, ITEM_VIDEO = 1, 2, 3, 4, 5
UPLOAD_IMAGE, UPLOAD_VIDEO, UPLOAD_FILE, UPLOAD_VOICE = 1, 2, 3, 4
TYPING, TYPING_CANCEL = 1, 2


class ILinkError(Exception):
    """iLink answered with a non-zero `ret` or `errcode`."""

    def __init__(self, call: str, ret: int | None, errcode: int | None, errmsg: str | None) -> None:
        super().__init__(f"{call}: ret={ret} errcode={errcode} errmsg={errmsg or ''}")
        self.call, self.ret, self.errcode, self.errmsg = call, ret, errcode, errmsg


class SessionExpired(ILinkError):
    """errcode -14: the bot token is stale; only a new QR login helps."""


def client_version(version: str) -> int:
    """`1.0.11` → 0x0001000B, as the package encodes iLink-App-ClientVersion."""
    parts = [int(p) if p.isdigit() else 0 for p in [*version.split("."), "0", "0", "0"][:3]]
    return ((parts[0] & 0xFF) << 16) | ((parts[1] & 0xFF) << 8) | (parts[2] & 0xFF)


def _random_uin() -> str:
    return base64.b64encode(str(secrets.randbits(32)).encode()).decode()


def check(call: str, data: Any) -> dict[str, Any]:
    """The answer as a dict; `ILinkError` / `SessionExpired` when it says it failed."""
    if not isinstance(data, dict):
        raise ILinkError(call, None, None, "answer is not a JSON object")
    ret, errcode = data.get("ret"), data.get("errcode")
    if STALE_TOKEN_ERRCODE in (ret, errcode):
        raise SessionExpired(call, ret, errcode, data.get("errmsg"))
    if (ret not in (None, 0)) or (errcode not in (None, 0)):
        raise ILinkError(call, ret, errcode, data.get("errmsg"))
    return data


@dataclass(frozen=True)
class Identity:
    """What every request says about the client (headers and `base_info`)."""

    app_id: str = "bot"
    version: str = "2.4.9"
    bot_agent: str = "chatgate/1.0"

    def headers(self) -> dict[str, str]:
        return {"iLink-App-Id": self.app_id, "iLink-App-ClientVersion": str(client_version(self.version))}

    def base_info(self) -> dict[str, str]:
        return {"channel_version": self.version, "bot_agent": self.bot_agent}


class ILinkClient:
    """One bot account's calls. `base_url` and `token` may change (a new login)."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        base_url: str,
        token: str | None,
        identity: Identity,
        *,
        timeout: float = 15.0,
    ) -> None:
        self.http = http
        self.base_url = base_url
        self.token = token
        self.identity = identity
        self.timeout = timeout

    def _url(self, endpoint: str) -> str:
        return self.base_url.rstrip("/") + "/" + endpoint

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "AuthorizationType": "ilink_bot_token",
            "X-WECHAT-UIN": _random_uin(),
            **self.identity.headers(),
        }
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        return headers

    async def post(self, endpoint: str, body: dict[str, Any], *, timeout: float | None = None) -> Any:
        """POST `body` (with `base_info`); the parsed answer. `httpx.HTTPError` on transport/HTTP failure."""
        resp = await self.http.post(
            self._url(endpoint),
            json={**body, "base_info": self.identity.base_info()},
            headers=self._headers(),
            timeout=timeout or self.timeout,
        )
        resp.raise_for_status()
        return resp.json()

    async def get_updates(self, cursor: str, timeout: float) -> dict[str, Any]:
        """One long poll from `cursor` (`get_updates_buf`, "" at first). A client-side timeout
        is a normal empty answer that keeps the cursor, as in Tencent's client."""
        try:
            data = await self.post("ilink/bot/getupdates", {"get_updates_buf": cursor}, timeout=timeout)
        except httpx.TimeoutException:
            return {"ret": 0, "msgs": [], "get_updates_buf": cursor}
        return check("getupdates", data)

    async def send_message(self, msg: dict[str, Any]) -> dict[str, Any]:
        return check("sendmessage", await self.post("ilink/bot/sendmessage", {"msg": msg}))

    async def get_config(self, user_id: str, context_token: str | None) -> dict[str, Any]:
        body = {"ilink_user_id": user_id, "context_token": context_token}
        return check("getconfig", await self.post("ilink/bot/getconfig", body))

    async def send_typing(self, user_id: str, ticket: str, status: int) -> None:
        body = {"ilink_user_id": user_id, "typing_ticket": ticket, "status": status}
        check("sendtyping", await self.post("ilink/bot/sendtyping", body))

    async def get_upload_url(self, body: dict[str, Any]) -> dict[str, Any]:
        return check("getuploadurl", await self.post("ilink/bot/getuploadurl", body))

    async def notify(self, what: str) -> None:
        """`start` or `stop`: tell iLink this client starts or stops polling (best-effort)."""
        check(f"notify{what}", await self.post(f"ilink/bot/msg/notify{what}", {}))

    # --- QR login (no bot token yet) ------------------------------------------------

    async def get_bot_qrcode(self, bot_type: str, local_tokens: list[str]) -> dict[str, Any]:
        """`{qrcode, qrcode_img_content}`: the code to poll and the URL the QR encodes."""
        resp = await self.http.post(
            self._url("ilink/bot/get_bot_qrcode"),
            params={"bot_type": bot_type},
            json={"local_token_list": local_tokens},
            headers={"Content-Type": "application/json", **self.identity.headers()},
            timeout=self.timeout,
        )
        resp.raise_for_status()
        data = resp.json()
        if not isinstance(data, dict) or not data.get("qrcode"):
            raise ILinkError(
                "get_bot_qrcode", data.get("ret") if isinstance(data, dict) else None, None, "no qrcode"
            )
        return data

    async def get_qrcode_status(
        self, qrcode: str, verify_code: str | None = None, *, timeout: float = 35.0
    ) -> dict[str, Any]:
        """Long-polled status of a login QR; a timeout or a gateway error reads as `wait`."""
        params = {"qrcode": qrcode}
        if verify_code:
            params["verify_code"] = verify_code
        try:
            resp = await self.http.get(
                self._url("ilink/bot/get_qrcode_status"),
                params=params,
                headers=self.identity.headers(),
                timeout=timeout,
            )
            resp.raise_for_status()
            data = resp.json()
        except (httpx.TransportError, httpx.HTTPStatusError, ValueError):
            return {"status": "wait"}
        return data if isinstance(data, dict) else {"status": "wait"}
