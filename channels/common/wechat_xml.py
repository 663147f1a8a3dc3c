"""The callback XML of WeCom and WeChat Official Accounts, parsed safely.

Callbacks are flat `<xml><Name>value</Name>…</xml>` documents. They never need a DTD, so
any DOCTYPE or ENTITY declaration is refused before and during parsing (no entity
expansion bombs, no external entities); sizes are bounded by the caller's body limit and
by `max_bytes` here for decrypted payloads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any
from xml.parsers import expat

from app.events import FilePart, ImagePart, Part, TextPart

MAX_XML_BYTES = 256 * 1024

_DECLARATION = re.compile(rb"<!\s*(DOCTYPE|ENTITY|ELEMENT|ATTLIST)", re.IGNORECASE)


class UnsafeXml(ValueError):
    """The document declares a DTD or entities; callbacks never do."""


class MalformedXml(ValueError):
    pass


def _refuse(*_: Any) -> Any:
    raise UnsafeXml("XML with a DOCTYPE or entity declaration is refused")


def parse_flat_xml(data: bytes | str, *, max_bytes: int = MAX_XML_BYTES) -> dict[str, str]:
    """`{tag: text}` of the root's children; raises `UnsafeXml` or `MalformedXml`.

    Built on expat directly (not ElementTree) so that declaration handlers can refuse a
    DTD the moment the parser meets one, whatever byte encoding hid it from the scan.
    Elements nested deeper than the root's children are allowed and ignored.
    """
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > max_bytes:
        raise MalformedXml(f"XML document is larger than {max_bytes} bytes")
    if _DECLARATION.search(raw):
        raise UnsafeXml("XML with a DOCTYPE or entity declaration is refused")
    fields: dict[str, str] = {}
    stack: list[str] = []
    text: list[str] = []
    root: list[str] = []

    def start(name: str, _attrs: Any) -> None:
        if not stack:
            root.append(name)
        stack.append(name)
        if len(stack) == 2:
            text.clear()

    def end(name: str) -> None:
        if len(stack) == 2:
            fields[name] = "".join(text).strip()
        stack.pop()

    def chars(data: str) -> None:
        if len(stack) == 2:
            text.append(data)

    parser = expat.ParserCreate()
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    parser.ExternalEntityRefHandler = _refuse
    parser.StartElementHandler = start
    parser.EndElementHandler = end
    parser.CharacterDataHandler = chars
    try:
        parser.Parse(raw, True)
    except expat.ExpatError as exc:
        raise MalformedXml(f"body is not well-formed XML: {exc}") from exc
    if root != ["xml"]:
        raise MalformedXml(f"root element is <{(root or ['none'])[0][:40]}>, expected <xml>")
    return fields


@dataclass(frozen=True)
class WeChatMessage:
    """A decrypted callback message (WeCom and Official Accounts share the field names)."""

    to_user: str
    from_user: str
    create_time: str
    msg_type: str
    msg_id: str | None
    fields: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_fields(cls, fields: dict[str, str]) -> WeChatMessage:
        missing = [k for k in ("FromUserName", "MsgType") if not fields.get(k)]
        if missing:
            raise MalformedXml(f"message lacks {', '.join(missing)}")
        return cls(
            to_user=fields.get("ToUserName", ""),
            from_user=fields["FromUserName"],
            create_time=fields.get("CreateTime", ""),
            msg_type=fields["MsgType"].lower(),
            msg_id=fields.get("MsgId") or fields.get("MsgID") or None,
            fields=fields,
        )

    @property
    def event(self) -> str | None:
        return self.fields.get("Event") if self.msg_type == "event" else None

    def dedup_id(self) -> str:
        """The platform's redelivery key: MsgId, or FromUserName + CreateTime for events."""
        if self.msg_id:
            return f"msg:{self.msg_id}"
        return f"event:{self.from_user}:{self.create_time}:{(self.event or '').lower()}"

    def parts(self) -> tuple[Part, ...] | None:
        """Event parts for the agent, or None for what is acknowledged but not handled.

        Text and images become text/image parts; a recognised voice message becomes its
        transcript (the Official Account's `Recognition`), other voice messages an audio
        part to fetch by `MediaId`; videos (`video`, `shortvideo`) and files (`file`, with
        its `FileName` when given) become file parts to fetch by `MediaId` (the type comes
        from `media/get`'s Content-Type); a menu click becomes its EventKey as text (so a
        menu button can carry a command such as /new); locations and links become short text descriptions.
        Other message types are stored with a placeholder so the agent can say it cannot
        read them. Subscriptions, enter-app and other notifications return None.
        """
        f = self.fields
        kind = self.msg_type
        if kind == "text":
            return (TextPart(text=f.get("Content", "")),)
        if kind == "image":
            return (ImagePart(url=f.get("PicUrl") or None),)
        if kind == "voice" and f.get("Recognition"):
            return (TextPart(text=f["Recognition"]),)
        if kind == "voice":  # the audio itself, fetched by MediaId (speech to text, if on)
            fmt = (f.get("Format") or "amr").lower()
            return (FilePart(name=f"voice.{fmt}", mime_type=f"audio/{fmt}"),)
        if kind in ("video", "shortvideo") and f.get("MediaId"):  # fetched by MediaId when kept
            return (FilePart(name=f"{kind}.mp4"),)
        if kind == "file" and f.get("MediaId"):  # WeCom; the Official Account has no file messages
            return (FilePart(name=f.get("FileName") or None),)
        if kind == "location":
            label = f.get("Label", "")
            where = f"{f.get('Location_X', '')},{f.get('Location_Y', '')}"
            return (TextPart(text=f"[location] {label} ({where})".replace("  ", " ")),)
        if kind == "link":
            return (TextPart(text=f"[link] {f.get('Title', '')} {f.get('Url', '')}".strip()),)
        if kind == "event":
            event = (self.event or "").lower()
            if event == "click" and f.get("EventKey"):
                return (TextPart(text=f["EventKey"]),)
            return None
        return (TextPart(text=f"[{kind} message]"),)

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"msg_type": self.msg_type}
        if self.fields.get("MediaId"):
            meta["media_id"] = self.fields["MediaId"]
        if self.event:
            meta["event"] = self.event
        return meta
