"""`chatgate channels weixin login|status`: the QR login from a terminal, and what is stored.

`login` draws the QR code in the terminal (and prints the URL it encodes, for when the
drawing does not scan), waits for WeChat to confirm, asks for the number WeChat shows
when iLink wants one, and stores the bot token in the database, where every replica
(and a running server, within `WEIXIN_EXPIRED_CHECK_SECONDS`) picks it up.
"""

from __future__ import annotations

import asyncio
import io
import sys
from typing import TextIO

import httpx
import qrcode

from app.config import Settings
from app.connections import fingerprint
from channels.weixin import login
from channels.weixin.api import Identity, ILinkClient
from channels.weixin.settings import WeixinSettings


def qr_text(url: str) -> str:
    """The QR code of `url` drawn with block characters (dark modules on a light terminal)."""
    code = qrcode.QRCode(border=1)
    code.add_data(url)
    out = io.StringIO()
    code.print_ascii(out=out, invert=True)
    return out.getvalue()


def qr_svg(url: str) -> str:
    """The QR code of `url` as an SVG document on white (it must scan in the dark theme too)."""
    import qrcode.image.svg

    image = qrcode.make(url, image_factory=qrcode.image.svg.SvgPathFillImage, border=2)
    return image.to_string(encoding="unicode")


async def _login(settings: Settings, wx: WeixinSettings, out: TextIO) -> int:
    from app.channel_records import ChannelRecords
    from app.db.engine import create_engine

    engine = create_engine(settings)
    records = ChannelRecords(engine, "weixin")

    def show(url: str) -> None:
        print("Scan this QR code with WeChat / 用微信扫描二维码:", file=out)
        print(qr_text(url), file=out)
        print(f"If it does not scan, open / 无法扫描时打开: {url}", file=out, flush=True)

    async def ask_code(retry: bool) -> str | None:
        prompt = (
            "Wrong number, again / 数字不匹配，请重新输入: "
            if retry
            else "Number WeChat shows / 输入微信显示的数字: "
        )
        line = await asyncio.to_thread(input, prompt)
        return line.strip() or None

    try:
        async with httpx.AsyncClient() as http:
            client = ILinkClient(
                http,
                wx.api_base_url,
                None,
                Identity(wx.app_id, wx.client_version, wx.bot_agent),
                timeout=wx.request_timeout_seconds,
            )
            result = await login.run_login(
                client,
                records,
                account=wx.account,
                bot_type=wx.bot_type,
                timeout=wx.login_timeout_seconds,
                progress=login.LoginProgress(),
                on_qr=show,
                ask_code=ask_code,
                poll_timeout=wx.poll_timeout_seconds,
            )
    except (httpx.HTTPError, ValueError) as exc:
        print(f"error: iLink login failed: {exc!r}", file=sys.stderr)
        return 1
    finally:
        await engine.dispose()
    print(result.message, file=out if result.ok else sys.stderr)
    return 0 if result.ok else 1


async def _status(settings: Settings, wx: WeixinSettings, out: TextIO) -> int:
    from app.channel_records import ChannelRecords
    from app.db.engine import create_engine

    engine = create_engine(settings)
    try:
        stored = await login.load(ChannelRecords(engine, "weixin"), wx.account)
    finally:
        await engine.dispose()
    if stored is None:
        print(f"account {wx.account}: not logged in", file=out)
        return 1
    print(
        f"account {wx.account}: {stored.status}, bot {stored.bot_id}, token {fingerprint(stored.bot_token)}, "
        f"logged in {stored.logged_in_at}" + (f", expired {stored.expired_at}" if stored.expired_at else ""),
        file=out,
    )
    return 0 if stored.status == "active" else 1


async def run_cli(settings: Settings, action: str, out: TextIO = sys.stdout) -> int:
    wx = WeixinSettings()
    if action == "login":
        return await _login(settings, wx, out)
    return await _status(settings, wx, out)
