"""QR-code login to iLink, and the stored login (the bot token) every replica reads.

The flow of Tencent's client (auth/login-qr.ts): `get_bot_qrcode?bot_type=3` gives a
`qrcode` (to poll) and `qrcode_img_content` (the URL the QR encodes, opened by WeChat);
`get_qrcode_status?qrcode=…` is long-polled: `wait`, `scaned`, `need_verifycode` (the
number WeChat shows is sent back as `verify_code`), `scaned_but_redirect` (poll
`https://<redirect_host>` from now on), `expired` / `verify_code_blocked` (a new QR, at
most three), `binded_redirect` (already bound: the stored login stays), and `confirmed`
with `bot_token`, `ilink_bot_id`, `baseurl` and the scanner's `ilink_user_id`.

The login is kept in the channel's records (`channel_records`, kind `login`, key the
account): the database is what every replica shares, the way the connection lease is.
When iLink says the token is stale (errcode -14) the record is marked `expired`; polling
pauses until a new login replaces it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import structlog

from app.channel import RecordStore
from app.connections import fingerprint
from channels.weixin.api import ILinkClient

log = structlog.get_logger(__name__)

KIND = "login"
MAX_QR = 3


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Login:
    """A stored login; `status` is `active` or `expired`."""

    bot_token: str
    base_url: str
    bot_id: str | None = None
    user_id: str | None = None
    status: str = "active"
    logged_in_at: str | None = None
    expired_at: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, data: dict[str, Any]) -> Login | None:
        if not isinstance(data.get("bot_token"), str) or not data.get("bot_token"):
            return None
        known: dict[str, Any] = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**known)

    def as_data(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


async def load(records: RecordStore | None, account: str) -> Login | None:
    if records is None:
        return None
    record = await records.get(KIND, account)
    return Login.of(record.data) if record is not None else None


async def save(records: RecordStore, account: str, login: Login) -> None:
    await records.put(KIND, account, login.as_data(), open=login.status == "active")


async def mark_expired(
    records: RecordStore | None, account: str, token: str, base_url: str, error: str
) -> None:
    """Record that `token` went stale, unless a newer login replaced it meanwhile."""
    if records is None:
        return
    current = await load(records, account)
    if current is not None and current.status == "active" and current.bot_token != token:
        return  # a new login came in between: it is not the one that expired
    same = current is not None and current.bot_token == token
    base = current if same and current is not None else Login(bot_token=token, base_url=base_url)
    expired = Login(**{**base.as_data(), "status": "expired", "expired_at": _now(), "error": error})
    await save(records, account, expired)


@dataclass
class LoginProgress:
    """What a login shows while it runs (the CLI prints it, the admin API returns it)."""

    status: str = "starting"
    qr_url: str | None = None  # what the QR code encodes (WeChat opens it)
    qr_count: int = 0
    message: str = ""
    bot_id: str | None = None
    done: bool = False
    ok: bool = False
    started: float = field(default_factory=time.monotonic)
    # Set when there is something to show: a QR code, or the end.
    shown: asyncio.Event = field(default_factory=asyncio.Event)

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "qr_url": self.qr_url,
            "message": self.message,
            "bot_id": self.bot_id,
            "done": self.done,
            "ok": self.ok,
        }


async def run_login(
    client: ILinkClient,
    records: RecordStore,
    *,
    account: str,
    bot_type: str,
    timeout: float,
    progress: LoginProgress,
    on_qr: Callable[[str], None] = lambda url: None,
    ask_code: Callable[[bool], Awaitable[str | None]] | None = None,
    poll_timeout: float = 35.0,
    pause: float = 1.0,
) -> LoginProgress:
    """Run one QR login to its end; on `confirmed` the login is stored for `account`.

    `on_qr(url)` is called with each QR's URL; `ask_code(retry)` asks the person for the
    number WeChat shows (`need_verifycode`), None when nobody can answer (the dashboard).
    """
    current = await load(records, account)
    local = [current.bot_token] if current is not None else []
    deadline = time.monotonic() + timeout
    base = client.base_url
    verify: str | None = None

    async def new_qr() -> str:
        data = await client.get_bot_qrcode(bot_type, local)
        progress.qr_count += 1
        progress.qr_url = str(data.get("qrcode_img_content") or "")
        progress.status = "wait"
        progress.shown.set()
        on_qr(progress.qr_url)
        return str(data["qrcode"])

    def finish(ok: bool, status: str, message: str) -> LoginProgress:
        progress.done, progress.ok, progress.status, progress.message = True, ok, status, message
        progress.shown.set()
        return progress

    qrcode = await new_qr()
    while time.monotonic() < deadline:
        poller = ILinkClient(client.http, base, None, client.identity, timeout=client.timeout)
        data = await poller.get_qrcode_status(qrcode, verify, timeout=poll_timeout)
        status = str(data.get("status") or "wait")
        progress.status = status
        if status == "confirmed":
            token, bot_id = data.get("bot_token"), data.get("ilink_bot_id")
            if not token or not bot_id:
                return finish(False, "failed", "login confirmed without bot_token or ilink_bot_id")
            login = Login(
                bot_token=str(token),
                base_url=str(data.get("baseurl") or client.base_url),
                bot_id=str(bot_id),
                user_id=str(data.get("ilink_user_id") or "") or None,
                logged_in_at=_now(),
            )
            await save(records, account, login)
            progress.bot_id = login.bot_id
            log.info(
                "weixin_logged_in", account=account, bot_id=login.bot_id, token=fingerprint(login.bot_token)
            )
            return finish(True, "confirmed", f"logged in as {login.bot_id}")
        if status == "binded_redirect":
            return finish(True, status, "this bot is already bound here; the stored login stays")
        if status == "scaned":
            verify = None  # the code was accepted
        elif status == "scaned_but_redirect" and data.get("redirect_host"):
            base = f"https://{data['redirect_host']}"
        elif status == "need_verifycode":
            code = await ask_code(verify is not None) if ask_code is not None else None
            if code is None:
                return finish(False, status, "WeChat asks for the number it shows: log in from the CLI")
            verify = code
            continue
        elif status in ("expired", "verify_code_blocked"):
            verify = None
            if progress.qr_count >= MAX_QR:
                return finish(False, status, f"the QR code expired {MAX_QR} times; try again later")
            qrcode = await new_qr()
            continue
        await asyncio.sleep(pause)
    return finish(False, "timeout", "nobody confirmed the login in time")
