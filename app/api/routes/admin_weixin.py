"""`/admin/api/channels/weixin/login`: the personal WeChat QR login from the dashboard.

`POST` starts a login on this replica (one at a time) and answers once the QR code is
there: its URL and an SVG image to show; `GET` tells how it goes (`wait`, `scaned`,
`confirmed` …) and what login is stored. A confirmed login is stored in the database and
picked up by the replica that polls. When WeChat asks for the number it shows
(`need_verifycode`), the login has to be done from the CLI.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from fastapi.responses import Response

from app.api.deps import get_runtime, require_admin
from app.runtime import Runtime

router = APIRouter(
    prefix="/admin/api/channels/weixin", tags=["weixin"], dependencies=[Depends(require_admin)]
)
QR_WAIT_SECONDS = 20.0


def _channel(runtime: Runtime) -> Any:
    from channels.weixin import WeixinChannel

    adapter = runtime.adapters.get("weixin")
    if not isinstance(adapter, WeixinChannel):
        raise HTTPException(404, "the weixin channel is not enabled (CHANNELS)")
    return adapter


async def _stored(channel: Any) -> dict[str, Any] | None:
    from channels.weixin import login

    stored = await login.load(channel.context.records, channel.settings.account)
    if stored is None:
        return None
    return {
        "status": stored.status,
        "bot_id": stored.bot_id,
        "logged_in_at": stored.logged_in_at,
        "expired_at": stored.expired_at,
    }


@router.post("/login", status_code=202)
async def start_login(runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Start a QR login (or join the one running); the QR code's URL and SVG image."""
    from channels.weixin.cli import qr_svg

    progress = _channel(runtime).logins.start()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(progress.shown.wait(), QR_WAIT_SECONDS)
    body = progress.as_dict()
    body["qr_svg"] = qr_svg(progress.qr_url) if progress.qr_url and not progress.done else None
    return body


@router.get("/login")
async def login_status(runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """The login in progress on this replica (if any), the stored login, and whether polling is paused."""
    channel = _channel(runtime)
    progress = channel.logins.progress
    return {
        "login": progress.as_dict() if progress is not None else None,
        "stored": await _stored(channel),
        "paused": await channel.problem(),
    }


@router.get("/login/qr.svg")
async def login_qr(runtime: Runtime = Depends(get_runtime)) -> Response:
    """The QR code of the login in progress, as an image."""
    from channels.weixin.cli import qr_svg

    progress = _channel(runtime).logins.progress
    if progress is None or progress.done or not progress.qr_url:
        raise HTTPException(404, "no login waiting for a scan: POST /admin/api/channels/weixin/login")
    return Response(qr_svg(progress.qr_url), media_type="image/svg+xml")
