"""What the Discord sender and streamer share: the uploads of a reply, the 404 error."""

from __future__ import annotations

from app.errors import ChannelRejected
from app.events import FilePart, ImagePart, OutboundMessage


class UnknownMessage(ChannelRejected):
    """404: the channel or message is gone (a deleted preview is replaced by a new message)."""


def uploads(message: OutboundMessage) -> list[ImagePart | FilePart]:
    """Parts whose bytes we hold; a part with only a URL is left to the text."""
    return [p for p in message.parts if isinstance(p, (ImagePart, FilePart)) and p.data_base64]


def attachment_name(part: ImagePart | FilePart) -> str:
    name = getattr(part, "name", None)
    if name:
        return str(name)
    subtype = (part.mime_type or "").partition("/")[2].split("+")[0]
    return f"image.{subtype or 'png'}" if isinstance(part, ImagePart) else "file"
