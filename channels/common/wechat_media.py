"""Temporary media (临时素材) of WeCom and WeChat Official Accounts, both ways.

Inbound images and voice messages carry a `MediaId`; `GET cgi-bin/media/get` with the
access token returns the bytes (an error comes back as JSON instead). Outbound images and
files are uploaded with `POST cgi-bin/media/upload?type=…` (multipart, field `media`),
and the message then names the returned `media_id`. Both refresh the token once when the
platform refuses it, like every other call of `TokenApi`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass

from app.errors import ChannelRejected, ChannelUnavailable
from app.events import FilePart, ImagePart, Part, TextPart
from app.fetch import GuardedFetcher
from channels.common.media import Media, download_capped
from channels.common.wechat_api import TokenApi, errcode_of

MEDIA_GET = "/cgi-bin/media/get"
MEDIA_UPLOAD = "/cgi-bin/media/upload"


@dataclass(frozen=True)
class Upload:
    """One image or file of a reply, ready for `media/upload`."""

    kind: str  # "image" or "file" (the upload's `type` and the message's `msgtype`)
    data: bytes
    filename: str
    mime_type: str


class WeChatMedia:
    def __init__(self, api: TokenApi, fetcher: GuardedFetcher) -> None:
        """`fetcher` downloads (the gateway's guarded one: the configured API base is
        trusted, and decoded bytes are counted while decoding)."""
        self.api = api
        self.fetcher = fetcher

    async def download(self, media_id: str, limit: int) -> Media:
        """The bytes of a temporary media; `MediaTooLarge` over `limit`.

        Other failures raise `httpx.HTTPError` or a delivery error (the caller keeps the
        reference); an invalid token is refreshed once.
        """
        for attempt in (1, 2):
            token = await self.api.tokens.get()
            media = await download_capped(
                self.fetcher,
                self.api.base_url + MEDIA_GET,
                limit,
                params={"access_token": token, "media_id": media_id},
                trusted=[self.api.base_url],
            )
            if not _is_json(media):
                return media
            try:
                data = json.loads(media.data)
            except ValueError:
                return media  # text that is not an error: it is the file
            if not isinstance(data, dict) or "errcode" not in data:
                raise ChannelRejected(f"{MEDIA_GET}: no file in the answer (a video link?)")
            if errcode_of(data) in self.api.errcodes.token_invalid and attempt == 1:
                self.api.tokens.invalidate(token)
                continue
            raise self.api.error(MEDIA_GET, data)
        raise AssertionError("unreachable")

    async def upload(self, item: Upload) -> str:
        """Upload one image or file; its `media_id` (valid three days)."""
        data = await self.api.post(
            MEDIA_UPLOAD,
            params={"type": item.kind},
            files={"media": (item.filename, item.data, item.mime_type)},
        )
        media_id = data.get("media_id")
        if not media_id:
            raise ChannelUnavailable(f"{MEDIA_UPLOAD}: answered without a media_id")
        return str(media_id)


def _is_json(media: Media) -> bool:
    kind = (media.content_type or "").lower()
    return "json" in kind or kind.startswith("text/plain")


def uploads(parts: Iterable[Part], *, files: bool = True) -> list[Upload]:
    """The reply's images (and, where the platform takes them, files) whose bytes we hold."""
    out: list[Upload] = []
    for part in parts:
        if not isinstance(part, (ImagePart, FilePart)) or not part.data_base64:
            continue
        if isinstance(part, ImagePart):
            ext = (part.mime_type or "image/png").split("/")[-1]
            out.append(Upload("image", _bytes(part), f"image.{ext}", part.mime_type or "image/png"))
        elif files:
            mime = part.mime_type or "application/octet-stream"
            out.append(Upload("file", _bytes(part), part.name or "file", mime))
    return out


def reply_text(parts: Iterable[Part], *, files: bool = True) -> str:
    """The reply's text, with a line for each image or file that is not uploaded.

    A part with only a URL becomes the link; a file the platform cannot take (the
    Official Account has no file messages) becomes its name.
    """
    lines: list[str] = []
    for part in parts:
        if isinstance(part, TextPart):
            lines.append(part.text)
        elif isinstance(part, (ImagePart, FilePart)):
            if part.data_base64 and (isinstance(part, ImagePart) or files):
                continue  # uploaded
            if part.url:
                lines.append(part.url)
            elif isinstance(part, FilePart) and part.name:
                lines.append(f"[{part.name}]")
    return "\n".join(line for line in lines if line)


def _bytes(part: ImagePart | FilePart) -> bytes:
    assert part.data_base64
    return base64.b64decode(part.data_base64)
