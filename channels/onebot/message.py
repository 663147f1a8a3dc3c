"""OneBot v11 messages: CQ-code strings, segment arrays, and chatgate parts.

A message arrives either as an array of segments (`[{"type", "data"}]`) or as a string
with CQ codes (`[CQ:at,qq=10001]hello`). Both are normalized to segments first, then
turned into parts; outbound parts become segments (always sent as an array, so user
text is never interpreted as CQ codes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from app.events import FilePart, ImagePart, MentionPart, Part, ReplyToPart, TextPart

Segment = dict[str, Any]

_CQ_CODE = re.compile(r"\[CQ:([^,\]]+)((?:,[^\]]*)?)\]")
_FACE_TOKEN = re.compile(r"\[face:(\d{1,4})\]")


def unescape(text: str) -> str:
    """Undo CQ escaping (`&#91;` `&#93;` `&#44;` `&amp;`); `&amp;` last so `&amp;#91;` stays `&#91;`."""
    return text.replace("&#91;", "[").replace("&#93;", "]").replace("&#44;", ",").replace("&amp;", "&")


def escape(text: str, *, in_param: bool = False) -> str:
    out = text.replace("&", "&amp;").replace("[", "&#91;").replace("]", "&#93;")
    return out.replace(",", "&#44;") if in_param else out


def parse_cq_string(message: str) -> list[Segment]:
    """Split a CQ-code string into segments, following the v11 string format rules."""
    segments: list[Segment] = []
    pos = 0
    for match in _CQ_CODE.finditer(message):
        if match.start() > pos:
            segments.append(text_segment(unescape(message[pos : match.start()])))
        data: dict[str, str] = {}
        for param in match.group(2).split(",")[1:]:
            key, sep, value = param.partition("=")
            if key:
                data[key] = unescape(value) if sep else ""
        segments.append({"type": match.group(1), "data": data})
        pos = match.end()
    if pos < len(message):
        segments.append(text_segment(unescape(message[pos:])))
    return segments


def to_cq_string(segments: Iterable[Segment]) -> str:
    out = []
    for seg in segments:
        data = seg.get("data") or {}
        if seg.get("type") == "text":
            out.append(escape(str(data.get("text", ""))))
            continue
        params = "".join(f",{k}={escape(str(v), in_param=True)}" for k, v in data.items())
        out.append(f"[CQ:{seg.get('type')}{params}]")
    return "".join(out)


def normalize(message: Any) -> list[Segment]:
    """The event's `message` as segments, whatever format the bridge reports in."""
    if isinstance(message, str):
        return parse_cq_string(message)
    if isinstance(message, dict):  # a single segment, seen from some bridges
        message = [message]
    if not isinstance(message, list):
        return []
    segments = []
    for seg in message:
        if isinstance(seg, dict) and isinstance(seg.get("type"), str):
            data = seg.get("data")
            segments.append({"type": seg["type"], "data": data if isinstance(data, dict) else {}})
    return segments


def text_segment(text: str) -> Segment:
    return {"type": "text", "data": {"text": text}}


@dataclass(frozen=True)
class ParsedMessage:
    parts: tuple[Part, ...]
    mentions_self: bool
    reply_to: str | None

    @property
    def has_content(self) -> bool:
        return any(isinstance(p, TextPart | ImagePart | FilePart) for p in self.parts)


def _media_url(data: dict[str, Any]) -> str | None:
    for key in ("url", "file"):
        value = data.get(key)
        if isinstance(value, str) and value.startswith(("http://", "https://")):
            return value
    return None


_AUDIO_TYPES = {"amr": "audio/amr", "mp3": "audio/mpeg", "wav": "audio/wav", "ogg": "audio/ogg"}


def _record_type(name: str | None) -> str:
    """A voice record's MIME type by its file name; QQ and WeChat voice is SILK otherwise."""
    ext = (name or "").rsplit(".", 1)[-1].lower()
    return _AUDIO_TYPES.get(ext, "audio/silk")


def segments_to_parts(segments: Sequence[Segment], self_id: str) -> ParsedMessage:
    """Turn segments into parts; `[face:N]` stands for a QQ face so it survives a round trip."""
    parts: list[Part] = []
    texts: list[str] = []
    mentions_self = False
    reply_to: str | None = None

    def flush() -> None:
        text = "".join(texts)
        texts.clear()
        if parts and isinstance(parts[-1], MentionPart):
            text = text.lstrip()  # "@bot hello" → "hello"
        if text.strip():
            parts.append(TextPart(text=text))

    for seg in segments:
        kind, data = seg["type"], seg["data"]
        if kind == "text":
            texts.append(str(data.get("text", "")))
        elif kind == "face":
            texts.append(f"[face:{data.get('id', '')}]")
        elif kind == "at":
            flush()
            qq = str(data.get("qq", ""))
            is_self = qq == self_id
            mentions_self = mentions_self or is_self
            parts.append(MentionPart(user_id=qq, is_self=is_self))
        elif kind == "reply":
            flush()
            reply_to = str(data.get("id", ""))
            parts.append(ReplyToPart(message_id=reply_to))
        elif kind == "image":
            flush()
            parts.append(ImagePart(url=_media_url(data)))
        elif kind in ("record", "video", "file"):
            flush()
            name = data.get("name") or data.get("file")
            name = str(name) if name else None
            mime = _record_type(name) if kind == "record" else None
            parts.append(FilePart(url=_media_url(data), name=name, mime_type=mime))
    flush()
    return ParsedMessage(parts=tuple(parts), mentions_self=mentions_self, reply_to=reply_to or None)


def _text_to_segments(text: str) -> list[Segment]:
    out: list[Segment] = []
    pos = 0
    for match in _FACE_TOKEN.finditer(text):
        if match.start() > pos:
            out.append(text_segment(text[pos : match.start()]))
        out.append({"type": "face", "data": {"id": match.group(1)}})
        pos = match.end()
    if pos < len(text):
        out.append(text_segment(text[pos:]))
    return out


def parts_to_segments(parts: Sequence[Part]) -> list[Segment]:
    segments: list[Segment] = []
    for part in parts:
        if isinstance(part, TextPart):
            segments += _text_to_segments(part.text)
        elif isinstance(part, ImagePart):
            if part.url:
                segments.append({"type": "image", "data": {"file": part.url}})
            elif part.data_base64:
                segments.append({"type": "image", "data": {"file": f"base64://{part.data_base64}"}})
        elif isinstance(part, MentionPart):
            segments.append({"type": "at", "data": {"qq": part.user_id}})
        elif isinstance(part, ReplyToPart):
            segments.insert(0, {"type": "reply", "data": {"id": part.message_id}})
        elif isinstance(part, FilePart) and part.url:
            # v11 has no "send a file" segment; a link is the portable fallback.
            segments.append(text_segment(f"{part.name + ': ' if part.name else ''}{part.url}"))
    return segments


def split_text(text: str, limit: int) -> list[str]:
    """Cut text into chunks of at most `limit` characters, preferring line breaks."""
    if len(text) <= limit:
        return [text]
    chunks = []
    while len(text) > limit:
        cut = text.rfind("\n", 0, limit)
        if cut <= limit // 2:
            cut = limit
        chunks.append(text[:cut])
        text = text[cut:].lstrip("\n")
    if text:
        chunks.append(text)
    return chunks
