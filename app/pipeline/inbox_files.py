"""Files a user sent, kept in the session's workspace where the file tools can read them.

With per-session workspaces on (`WORKSPACE_ROOT` and `WORKSPACE_PER_SESSION`), every image
or file part an adapter downloaded (its bytes in `data_base64`, under the channel's
`<CHANNEL>_MEDIA_MAX_BYTES`) is written to `inbox/<message id>-<safe name>` in the
workspace of the session that handles it, when its turn starts (the session generation,
hence the directory, is known only then). The user message in the history names the
path (`workspace_path` on the part) and the model is told it; a document's bytes are not
kept in the history (the workspace has them), an image's are (a vision model sees them).

Only per-session workspaces: with one shared directory, a file sent in one conversation
would be readable from every other.
"""

from __future__ import annotations

import asyncio
import base64
import mimetypes
import re
from collections.abc import Sequence
from pathlib import Path

import structlog

from app.agent.workspace import Workspace
from app.events import FilePart, ImagePart, InboundEvent, Part
from app.pipeline.replies import user_message
from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)

INBOX_DIR = "inbox"
MAX_NAME_CHARS = 120  # the file name after `<message id>-`
MAX_ID_CHARS = 64
_UNSAFE_NAME = re.compile(r"[^\w.\-]+")  # \w: letters of any script, digits, underscore
_UNSAFE_ID = re.compile(r"[^A-Za-z0-9_\-]+")


def safe_name(name: str | None, fallback: str) -> str:
    """A file name that is one harmless path component: no directories, no `..`, no
    hidden file, no control characters, at most `MAX_NAME_CHARS` (the extension kept)."""
    base = (name or "").replace("\\", "/").rsplit("/", 1)[-1]
    base = _UNSAFE_NAME.sub("_", base).strip("._") or fallback
    if len(base) > MAX_NAME_CHARS:
        stem, dot, ext = base.rpartition(".")
        ext = ext[:16] if dot and stem else ""
        base = base[: MAX_NAME_CHARS - len(ext) - 1] + "." + ext if ext else base[:MAX_NAME_CHARS]
    return base


def _message_id(event: InboundEvent) -> str:
    raw = event.external_id or event.event_id
    return _UNSAFE_ID.sub("_", raw).strip("_")[:MAX_ID_CHARS] or event.event_id


def _fallback(part: ImagePart | FilePart, index: int) -> str:
    ext = mimetypes.guess_extension(part.mime_type or "") or ""
    return ("image" if isinstance(part, ImagePart) else "file") + (f"-{index}" if index else "") + ext


class InboxFiles:
    def __init__(self, workspace: Workspace | None) -> None:
        self.workspace = workspace  # per-session, or None: files are not kept

    @property
    def enabled(self) -> bool:
        return self.workspace is not None

    def paths(self, event: InboundEvent) -> dict[int, str]:
        """Part index → its path in the workspace, for the parts with bytes."""
        if self.workspace is None:
            return {}
        found: dict[int, str] = {}
        used: set[str] = set()
        prefix = _message_id(event)
        for index, part in enumerate(event.parts):
            if not isinstance(part, (ImagePart, FilePart)) or not part.data_base64:
                continue
            name = safe_name(part.name if isinstance(part, FilePart) else None, _fallback(part, index))
            path = f"{INBOX_DIR}/{prefix}-{name}"
            if path in used:  # two files of one message with the same name
                path = f"{INBOX_DIR}/{prefix}-{index}-{name}"
            used.add(path)
            found[index] = path
        return found

    def message(self, event: InboundEvent) -> ChatMessage:
        """The user message of `event`, its kept files named by their workspace path."""
        paths = self.paths(event)
        if not paths:
            return user_message(event)
        parts: list[Part] = []
        for index, part in enumerate(event.parts):
            path = paths.get(index)
            if path is None:
                parts.append(part)
            elif isinstance(part, FilePart):  # the workspace holds the bytes
                parts.append(part.model_copy(update={"workspace_path": path, "data_base64": None}))
            else:
                parts.append(part.model_copy(update={"workspace_path": path}))
        return user_message(event.model_copy(update={"parts": tuple(parts)}))

    async def save(self, events: Sequence[InboundEvent], session_key: str, generation: int) -> None:
        """Write the events' files into the session generation's workspace (idempotent:
        a turn run again after a crash writes the same bytes to the same paths)."""
        if self.workspace is None:
            return
        todo = [(e, self.paths(e)) for e in events]
        if not any(paths for _, paths in todo):
            return
        workspace = self.workspace.for_session(session_key, generation)
        for event, paths in todo:
            for index, path in paths.items():
                part = event.parts[index]
                assert isinstance(part, (ImagePart, FilePart)) and part.data_base64
                real = workspace.resolve(path)  # the path policy, though the name is safe
                data = base64.b64decode(part.data_base64)
                await asyncio.to_thread(_write, real, data)
                log.info("inbox_file_saved", path=path, size=len(data))


def _write(real: Path, data: bytes) -> None:
    real.parent.mkdir(parents=True, exist_ok=True)
    real.write_bytes(data)
