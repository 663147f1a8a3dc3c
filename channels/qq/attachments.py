"""QQ message attachments as parts: images, voice (the platform's transcript when it has
one, else the WAV transcoding or the SILK original), other files (documents, whose
`content_type` is "file", and videos)."""

from __future__ import annotations

from typing import Any

from app.events import FilePart, ImagePart, Part, TextPart


def attachment_part(att: dict[str, Any]) -> Part:
    url = _absolute(clean_str(att.get("url")))
    content_type = clean_str(att.get("content_type")) or ""
    if content_type.startswith("image"):
        return ImagePart(url=url, mime_type=content_type)
    if content_type == "voice" or content_type.startswith("audio/"):
        transcript = clean_str(att.get("asr_refer_text"))
        if transcript:  # the platform's own speech recognition
            return TextPart(text=transcript)
        wav = _absolute(clean_str(att.get("voice_wav_url")))
        return FilePart(
            url=wav or url,
            name="voice.wav" if wav else clean_str(att.get("filename")) or "voice.silk",
            mime_type="audio/wav" if wav else "audio/silk",
        )
    size = att.get("size")
    return FilePart(
        url=url,
        name=clean_str(att.get("filename")),
        mime_type=content_type if "/" in content_type else None,  # "file": from the download
        size=size if isinstance(size, int) else None,
    )


def _absolute(url: str | None) -> str | None:
    """The platform reports attachment URLs without a scheme (or as `//host/…`)."""
    if url and not url.startswith(("http://", "https://")):
        return "https://" + url.lstrip("/")
    return url


def clean_str(value: Any) -> str | None:
    if value is None or isinstance(value, bool):
        return None
    text = str(value).strip()
    return text or None
