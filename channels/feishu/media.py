"""Feishu media: a reply's images and files uploaded (`im/v1/images`, `im/v1/files`) to be sent.

An image is uploaded with `image_type=message` and sent as `msg_type=image` with its
`image_key`; any other file with `file_type` (opus, mp4, pdf, doc, xls, ppt or stream),
`file_name` and the bytes, then sent as `msg_type=file` with its `file_key`.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from app.errors import ChannelUnavailable
from app.events import FilePart, ImagePart
from channels.feishu.api import FeishuApi

IMAGES_PATH = "/open-apis/im/v1/images"
FILES_PATH = "/open-apis/im/v1/files"
_FILE_TYPES = {
    "pdf": "pdf",
    "doc": "doc",
    "docx": "doc",
    "xls": "xls",
    "xlsx": "xls",
    "ppt": "ppt",
    "pptx": "ppt",
    "mp4": "mp4",
    "opus": "opus",
}


def file_type(name: str) -> str:
    return _FILE_TYPES.get(name.rpartition(".")[2].lower(), "stream") if "." in name else "stream"


async def upload(api: FeishuApi, part: ImagePart | FilePart) -> tuple[str, str]:
    """Upload the part; the `msg_type` and `content` of the message that shows it."""
    assert part.data_base64 is not None
    data = base64.b64decode(part.data_base64)
    mime = part.mime_type or "application/octet-stream"
    if isinstance(part, ImagePart):
        answer: Any = await api.upload(IMAGES_PATH, {"image_type": "message"}, ("image", data, mime))
        key = answer.get("image_key") if isinstance(answer, dict) else None
        if not isinstance(key, str) or not key:
            raise ChannelUnavailable(f"{IMAGES_PATH} answered without an image_key")
        return "image", json.dumps({"image_key": key})
    name = part.name or "file"
    fields = {"file_type": file_type(name), "file_name": name}
    answer = await api.upload(FILES_PATH, fields, (name, data, mime))
    key = answer.get("file_key") if isinstance(answer, dict) else None
    if not isinstance(key, str) or not key:
        raise ChannelUnavailable(f"{FILES_PATH} answered without a file_key")
    return "file", json.dumps({"file_key": key})
