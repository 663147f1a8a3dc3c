"""Inbound media made visible to the model: downloaded under a size limit, as data.

A channel knows how to fetch one image or voice part from its platform (a media id with
an access token, a URL), always through the gateway's guarded fetcher
(`ChannelContext.fetcher`, `app.fetch`: a URL from a payload reaches no private address,
and decoded bytes are counted while decoding); `inline_media` does the rest the same way
on every channel:
images become image parts carrying their bytes (`data_base64`, which a vision model sees
as a `data:` URL), voice notes are transcribed when speech to text is on (the transcript
becomes the user's text, the audio stays a part), and a file over the limit raises
`MediaTooLarge` before anything is stored; the channel then answers politely
(`too_large_text`). A fetch that fails otherwise keeps the part as it was, a reference
the model is told about in text, rather than losing the message.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from pydantic import BaseModel, Field

from app.errors import DeliveryError
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage, Part, TextPart
from app.fetch import FetchRefused, GuardedFetcher, TooLarge

log = structlog.get_logger(__name__)

Transcribe = Callable[[bytes, str, str, InboundEvent], Awaitable[str]]


class MediaSettings(BaseModel):
    """Mixin for a channel's settings class: `<CHANNEL>_MEDIA_MAX_BYTES`."""

    media_max_bytes: int = Field(
        10_000_000,
        ge=1,
        description="Larger images, voice notes and (kept in per-session workspaces) files are refused "
        "with a polite reply; nothing is stored.",
    )


# The file is larger than the channel's `media_max_bytes` (decoded): the fetcher's own
# exception, so that a limit hit inside the fetcher and one a channel checks are one.
MediaTooLarge = TooLarge


@dataclass(frozen=True)
class Media:
    data: bytes
    content_type: str | None = None


def answer_to(event: InboundEvent, text: str) -> OutboundMessage:
    """A plain text answer to `event` in its chat, with the reply metadata (`reply_*`) the
    channel's `send` uses to quote or to name the bot that received it."""
    return OutboundMessage(
        channel=event.channel,
        chat_id=event.chat_id,
        thread_id=event.thread_id,
        parts=(TextPart(text=text),),
        metadata={k: v for k, v in event.metadata.items() if k.startswith("reply_")},
    )


def too_large_text(locale: str, limit: int) -> str:
    """The polite reply to a file over the limit, in the channel's locale."""
    megabytes = f"{limit / 1_000_000:g} MB"
    if locale == "zh":
        return f"抱歉，这个文件太大了，我无法处理（上限 {megabytes}）。"
    return f"Sorry, that file is too large for me to read (the limit is {megabytes})."


async def tell_too_large(
    send: Callable[[OutboundMessage], Awaitable[Any]], event: InboundEvent, locale: str, limit: int
) -> None:
    """Best-effort: the polite reply to a file over the limit, through the channel's own
    `send` (the event itself is not stored, so nothing retries it)."""
    try:
        await send(answer_to(event, too_large_text(locale, limit)))
    except DeliveryError as exc:
        log.warning("too_large_reply_failed", channel=event.channel, error=exc.detail)


async def download_capped(
    fetcher: GuardedFetcher,
    url: str,
    limit: int,
    *,
    params: Mapping[str, str] | None = None,
    headers: Mapping[str, str] | None = None,
    trusted: Sequence[str] = (),
) -> Media:
    """GET `url` through the guarded fetcher, refusing more than `limit` decoded bytes.

    `trusted`: base URLs the operator configured (the platform's API or file base) under
    which `url` may be on a private address; a URL from a payload passes none.
    Raises `MediaTooLarge`, `app.fetch.FetchRefused`, or `httpx.HTTPError` (the fetcher's
    `FetchError`, a non-2xx answer included).
    """
    answer = await fetcher.get(url, limit=limit, params=params, headers=headers, trusted=trusted)
    return Media(answer.content, answer.content_type)


def is_voice(part: Part) -> bool:
    return isinstance(part, FilePart) and (part.mime_type or "").startswith("audio/")


async def inline_media(
    event: InboundEvent,
    fetch: Callable[[ImagePart | FilePart], Awaitable[Media | None]],
    *,
    transcribe: Transcribe | None,
    channel: str,
    files: bool = False,
) -> InboundEvent:
    """`event` with its images (and, with speech to text, its voice notes) as data.

    `fetch(part)` downloads one part, or answers None for a part it cannot fetch (no
    media id, no URL). With `files` (the gateway keeps received files in the session's
    workspace, `ChannelContext.keeps_files`) every other file part is downloaded too.
    `MediaTooLarge` propagates: the caller answers and stores nothing.
    """
    wanted = [
        p
        for p in event.parts
        if isinstance(p, ImagePart)
        or (isinstance(p, FilePart) and (files or (transcribe is not None and is_voice(p))))
    ]
    if not wanted:
        return event
    parts: list[Part] = []
    transcripts: list[str] = []
    for part in event.parts:
        if part not in wanted:
            parts.append(part)
            continue
        assert isinstance(part, (ImagePart, FilePart))
        try:
            media = await fetch(part)
            if media is None:
                parts.append(part)
                continue
            if isinstance(part, FilePart) and transcribe is not None and is_voice(part):
                mime = part.mime_type or media.content_type or "audio/amr"
                transcripts.append(await transcribe(media.data, part.name or "voice", mime, event))
        except MediaTooLarge:
            raise
        except FetchRefused as exc:  # a URL from the payload aims somewhere private
            log.warning("media_fetch_refused", channel=channel, reason=str(exc))
            parts.append(_refused(part))
            continue
        except Exception as exc:  # the platform or the STT endpoint failed: keep the reference
            log.warning("media_fetch_failed", channel=channel, error=str(exc) or repr(exc))
            parts.append(part)
            continue
        data64 = base64.b64encode(media.data).decode()
        if isinstance(part, ImagePart):
            mime = part.mime_type or _image_type(media.content_type)
            parts.append(ImagePart(data_base64=data64, mime_type=mime))
        else:
            file_mime = part.mime_type or media.content_type
            update = {"url": None, "data_base64": data64, "size": len(media.data), "mime_type": file_mime}
            parts.append(part.model_copy(update=update))
    if any(transcripts):  # the transcript is the user's text; the audio stays as a part
        parts.insert(0, TextPart(text="\n".join(t for t in transcripts if t)))
    return event.model_copy(update={"parts": tuple(parts)})


def _refused(part: ImagePart | FilePart) -> Part:
    """What stays of a part whose URL was refused. An image becomes text naming the link:
    as an image part its URL would be handed to the model endpoint as an `image_url`, and
    a self-hosted model server would fetch it from inside the network for us."""
    if isinstance(part, ImagePart):
        return TextPart(text=f"[an image link that was not fetched (a private address): {part.url}]")
    return part


def _image_type(content_type: str | None) -> str:
    if content_type and content_type.startswith("image/"):
        return content_type
    return "image/jpeg"  # what the chat platforms serve photos as
