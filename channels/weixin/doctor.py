"""`chatgate doctor`'s check of personal WeChat: the stored login, then iLink asked live."""

from __future__ import annotations

from typing import Any

import httpx

from app.connections import fingerprint
from channels.weixin import login
from channels.weixin.api import Identity, ILinkClient, ILinkError, SessionExpired
from channels.weixin.settings import WeixinSettings

RELOGIN = "run `chatgate channels weixin login`"


async def check(settings: Any, wx: WeixinSettings) -> tuple[bool, str]:
    from app.channel_records import ChannelRecords
    from app.db.engine import create_engine

    engine = create_engine(settings)
    try:
        stored = await login.load(ChannelRecords(engine, "weixin"), wx.account)
    except Exception as exc:  # the database check above says why
        return False, f"login not readable: {exc!r}"
    finally:
        await engine.dispose()
    if stored is not None and stored.status != "active":
        return False, f"session expired at {stored.expired_at} (errcode -14), polling paused: {RELOGIN}"
    token = stored.bot_token if stored is not None else wx.bot_token
    base = stored.base_url if stored is not None else wx.api_base_url
    if not token:
        return False, f"not logged in: {RELOGIN} (or set WEIXIN_BOT_TOKEN)"
    user = (stored.user_id if stored is not None else None) or ""
    async with httpx.AsyncClient() as http:
        client = ILinkClient(
            http, base, token, Identity(wx.app_id, wx.client_version, wx.bot_agent), timeout=10.0
        )
        try:
            await client.get_config(user, None)
        except SessionExpired:
            return False, f"iLink says the session expired (errcode -14): {RELOGIN}"
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code in (401, 403):
                return False, f"iLink refused the token ({exc.response.status_code}): {RELOGIN}"
            return False, f"{base} answered {exc.response.status_code}"
        except httpx.HTTPError as exc:
            return False, f"{base} not answering: {exc!r}"
        except ILinkError:
            pass  # answered, and not about the token: the session holds
    who = stored.bot_id if stored is not None and stored.bot_id else f"token {fingerprint(token)}"
    return True, f"logged in ({who}), {base} answered"
