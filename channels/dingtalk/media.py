"""DingTalk media out: a reply's images and files uploaded, then sent as robot messages.

The robot send API takes media by `media_id`, which only the old OpenAPI hands out:
`POST {DINGTALK_OAPI_BASE}/media/upload?access_token=…&type=image|file` (multipart field
`media`; the app's access token from `/v1.0/oauth2/accessToken` is valid there too), which
answers `{"errcode": 0, "media_id": "@lA…"}`. An image is then sent as `sampleImageMsg`
(`photoURL` = the media id), any other file as `sampleFile` (`mediaId`, `fileName`,
`fileType`). Errors come as `errcode`: an expired or invalid token is renewed once,
`-1` (busy) is retried by the outbox, anything else is a refusal of this file.

A session webhook cannot carry media: a sender reachable only through it (someone outside
the organisation) is told the file's name in text instead.
"""

from __future__ import annotations

import base64
from typing import Any

import httpx

from app.errors import ChannelRateLimited, ChannelRejected, ChannelUnavailable
from app.events import FilePart, ImagePart
from channels.dingtalk.openapi import DingTalkApi

UPLOAD_PATH = "/media/upload"
# The token is missing, invalid or expired: fetch a new one and try once more.
TOKEN_ERRCODES = frozenset({40001, 40014, 42001})
BUSY_ERRCODES = frozenset({-1})
THROTTLED_ERRCODES = frozenset({90018, 45009})
_OCTETS = "application/octet-stream"


def file_name(part: ImagePart | FilePart) -> str:
    if isinstance(part, FilePart) and part.name:
        return part.name
    subtype = (part.mime_type or "image/png").partition("/")[2] or "png"
    return f"image.{subtype}" if isinstance(part, ImagePart) else "file"


def unsendable_text(part: ImagePart | FilePart, locale: str) -> str:
    """What a sender reachable only by session webhook gets instead of the file."""
    if locale == "zh":
        return f"📎 {file_name(part)}（此会话无法接收文件）"
    return f"📎 {file_name(part)} (files cannot be sent in this chat)"


async def upload(api: DingTalkApi, oapi_base: str, part: ImagePart | FilePart) -> tuple[str, dict[str, Any]]:
    """Upload the part; the robot message (`msgKey`, `msgParam`) that shows it."""
    assert part.data_base64 is not None
    data = base64.b64decode(part.data_base64)
    kind = "image" if isinstance(part, ImagePart) else "file"
    name = file_name(part)
    media_id = await _upload(api, oapi_base.rstrip("/"), kind, (name, data, part.mime_type or _OCTETS))
    if kind == "image":
        return "sampleImageMsg", {"photoURL": media_id}
    extension = name.rpartition(".")[2].lower() if "." in name else "file"
    return "sampleFile", {"mediaId": media_id, "fileName": name, "fileType": extension}


async def _upload(api: DingTalkApi, base: str, kind: str, file: tuple[str, bytes, str]) -> str:
    for attempt in (1, 2):
        token = await api.access_token()
        try:
            resp = await api.http.post(
                base + UPLOAD_PATH,
                params={"access_token": token, "type": kind},
                files={"media": file},
                timeout=api.timeout,
            )
        except httpx.HTTPError as exc:
            raise ChannelUnavailable(f"DingTalk media/upload unreachable: {exc!r}") from exc
        try:
            answer = resp.json()
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            if resp.status_code == 429:
                raise ChannelRateLimited(1.0, "DingTalk media/upload: HTTP 429")
            if resp.status_code >= 500 or resp.status_code < 400:
                raise ChannelUnavailable(f"DingTalk media/upload: HTTP {resp.status_code}")
            raise ChannelRejected(f"DingTalk media/upload: HTTP {resp.status_code}")
        code = _errcode(answer)
        detail = (
            f"DingTalk media/upload: errcode {answer.get('errcode')} {answer.get('errmsg') or ''}".strip()
        )
        if code in TOKEN_ERRCODES and attempt == 1:
            api.forget_token(token)
            continue
        if code in BUSY_ERRCODES or resp.status_code >= 500:
            raise ChannelUnavailable(detail)
        if code in THROTTLED_ERRCODES or resp.status_code == 429:
            raise ChannelRateLimited(1.0, detail)
        if code != 0:
            raise ChannelRejected(detail)
        media_id = answer.get("media_id")
        if not isinstance(media_id, str) or not media_id:
            raise ChannelUnavailable("DingTalk media/upload answered without a media_id")
        return media_id
    raise AssertionError("unreachable")


def _errcode(answer: dict[str, Any]) -> int:
    try:
        return int(answer.get("errcode", 0) or 0)
    except (TypeError, ValueError):
        return -1
