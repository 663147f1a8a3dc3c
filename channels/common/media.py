"""Inbound media shared by the channels: size-limited downloads into image parts.

A channel lists the parts it can fetch and says how (`fetch_images`); each image is
downloaded under the channel's `media_max_bytes` and becomes an `ImagePart` with its bytes
(`data_base64`), which a model with `LLM_VISION=true` sees as a `data:` URL. A file over
the limit makes the whole event refused (the channel sends `too_large_text` and stores
nothing); a download that fails keeps the part as it was, a reference the model is told
about in text. Files other than images stay references.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping

import httpx
import structlog
from pydantic import BaseModel, Field

from app.events import ImagePart, InboundEvent, Part

log = structlog.get_logger(__name__)


class MediaSettings(BaseModel):
    """Mixin for a channel's settings: `<CHANNEL>_MEDIA_MAX_BYTES`."""

    media_max_bytes: int = Field(
        10_000_000, ge=1, description="Larger images are refused with a polite reply; nothing is stored."
    )


class MediaTooLarge(Exception):
    """The file is over the channel's limit."""


def too_large_text(locale: str, limit: int) -> str:
    megabytes = f"{limit / 1_000_000:g} MB"
    if locale == "zh":
        return f"抱歉，这个文件太大了，我无法处理（上限 {megabytes}）。"
    return f"Sorry, that file is too large for me to read (the limit is {megabytes})."


async def download(
    http: httpx.AsyncClient,
    url: str,
    limit: int,
    *,
    headers: Mapping[str, str] | None = None,
    method: str = "GET",
) -> tuple[bytes, str | None]:
    """The body of `url` and its content type; `MediaTooLarge` as soon as it passes `limit`."""
    async with http.stream(method, url, headers=dict(headers or {})) as resp:
        resp.raise_for_status()
        declared = resp.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise MediaTooLarge
        data = bytearray()
        async for piece in resp.aiter_bytes():
            data += piece
            if len(data) > limit:
                raise MediaTooLarge
        kind = resp.headers.get("content-type")
    return bytes(data), kind.split(";")[0].strip() if kind else None


Fetch = Callable[[ImagePart], Awaitable[tuple[bytes, str | None]]]


async def fetch_images(
    event: InboundEvent, wanted: Callable[[Part], bool], fetch: Fetch, *, channel: str
) -> InboundEvent | None:
    """`event` with each wanted image part replaced by its bytes; None when one is too large.

    `fetch` raises `MediaTooLarge`, or anything else for a failed download (logged; the
    part stays a reference).
    """
    if not any(isinstance(p, ImagePart) and wanted(p) for p in event.parts):
        return event
    parts: list[Part] = []
    for part in event.parts:
        if not (isinstance(part, ImagePart) and wanted(part)):
            parts.append(part)
            continue
        try:
            data, kind = await fetch(part)
        except MediaTooLarge:
            return None
        except Exception as exc:  # the platform's error or a network failure
            log.warning("media_download_failed", channel=channel, error=repr(exc))
            parts.append(part)
            continue
        mime = part.mime_type or (kind if kind and kind.startswith("image/") else None)
        parts.append(ImagePart(data_base64=base64.b64encode(data).decode(), mime_type=mime))
    return event.model_copy(update={"parts": tuple(parts)})
