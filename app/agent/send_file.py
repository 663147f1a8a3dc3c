"""`send_file`: the model attaches a workspace file to its answer.

The tool reads the file (the file tools' path policy, `SEND_FILE_MAX_BYTES`) and returns
a `ToolOutput` whose attachment is an image part (the types chat apps show inline) or a
file part, with the bytes. The run keeps two things per attachment (`keep`):

- the part with its bytes, in memory (`RunRecord.media`), for the answer of this run;
- a reference without the bytes (`workspace_path`, name, type, size) in the run's
  details (`RunRecord.details["attachments"]`), which is stored with the run.

When the run ends — with an answer, `/stop`, the step limit or a model failure — its
answer carries every attachment (`answer_parts`). A run paused for an approval and
resumed later (maybe in another process) has only the references of what was attached
before the pause: those files are read again from the workspace (`SendFileTool.reload`).
The history keeps references only (`without_bytes`); the outbox row carries the bytes.
"""

from __future__ import annotations

import asyncio
import base64
import json
import mimetypes
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, ToolContext, ToolError, ToolOutput, ToolRegistry
from app.agent.workspace import Workspace, path_arg

log = structlog.get_logger(__name__)

ATTACHMENTS = "attachments"  # the key of the references in a run's details
# What chat platforms show as a picture; other images (SVG, TIFF …) go as files.
INLINE_IMAGES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


class SendFileTool:
    spec = ToolSpec(
        name="send_file",
        description=(
            "Send a file from the workspace to the user together with your final answer: "
            "pictures (PNG, JPEG, GIF, WebP) are shown as images, anything else is sent as a "
            "document. Call it once per file, then write your answer as usual."
        ),
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "relative to the workspace root"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, workspace: Workspace, *, max_bytes: int = 10_000_000) -> None:
        self.workspace = workspace
        self.max_bytes = max_bytes

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> ToolOutput:
        part = await self._read(path_arg(arguments), ctx)
        kind = part["type"]
        note = {
            "attached": part["workspace_path"],
            "as": kind,
            "bytes": len(base64.b64decode(part["data_base64"])),
            "note": "it will be sent with your final answer; do not paste its content",
        }
        return ToolOutput(text=json.dumps(note, ensure_ascii=False), attachments=(part,))

    async def reload(self, reference: dict[str, Any], ctx: ToolContext) -> dict[str, Any] | None:
        """The attachment `reference` names, read again (None: it is gone or too large now)."""
        try:
            return await self._read(str(reference.get("workspace_path") or ""), ctx)
        except ToolError as exc:
            log.warning("attachment_lost", path=reference.get("workspace_path"), error=str(exc))
            return None

    async def _read(self, path: str, ctx: ToolContext) -> dict[str, Any]:
        workspace = self.workspace.scoped(ctx)
        real = workspace.resolve(path)
        if not real.is_file():
            raise ToolError(f"no file {workspace.display(real)!r}")
        size = real.stat().st_size
        if size > self.max_bytes:
            raise ToolError(f"{workspace.display(real)!r} has {size} bytes; the limit is {self.max_bytes}")
        data = await asyncio.to_thread(real.read_bytes)
        if len(data) > self.max_bytes:  # it grew since the stat
            raise ToolError(f"{workspace.display(real)!r} is larger than {self.max_bytes} bytes")
        return file_part(data, real.name, workspace.display(real))


def file_part(data: bytes, name: str, workspace_path: str) -> dict[str, Any]:
    """An image part (by MIME type) or a file part with `data`, as an event part dict."""
    mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
    part: dict[str, Any] = {
        "data_base64": base64.b64encode(data).decode(),
        "mime_type": mime,
        "workspace_path": workspace_path,
    }
    if mime in INLINE_IMAGES:
        return {"type": "image", **part}
    return {"type": "file", **part, "name": name, "size": len(data)}


def without_bytes(parts: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    """The parts as references (what the history and a run's details keep)."""
    return tuple({k: v for k, v in p.items() if k != "data_base64"} for p in parts)


def keep(output: str | ToolOutput, details: dict[str, Any], media: list[dict[str, Any]]) -> str:
    """The text for the model; attachments go to `media` and their references to `details`."""
    if isinstance(output, str):
        return output
    if output.attachments:
        media.extend(output.attachments)
        details.setdefault(ATTACHMENTS, []).extend(without_bytes(output.attachments))
    return output.text


async def answer_parts(
    details: dict[str, Any], media: Sequence[dict[str, Any]], tools: ToolRegistry, ctx: ToolContext
) -> tuple[dict[str, Any], ...] | None:
    """Every attachment of the run, with its bytes, in the order attached (None: none).

    `media` holds what was attached in this process: the newest references. The older
    ones (attached before an approval pause) are read again from the workspace.
    """
    references: list[dict[str, Any]] = list(details.get(ATTACHMENTS) or ())
    if not references:
        return None
    missing = references[: len(references) - len(media)]
    parts: list[dict[str, Any]] = []
    tool = tools.get(SendFileTool.spec.name)
    for reference in missing:
        part = await tool.reload(reference, ctx) if isinstance(tool, SendFileTool) else None
        if part is not None:
            parts.append(part)
    parts.extend(media)
    return tuple(parts) or None


async def stored_attachments(
    details: dict[str, Any], tools: ToolRegistry, *, session_id: int, session_key: str, generation: int
) -> tuple[dict[str, Any], ...] | None:
    """The attachments of a paused run, read again from its session's workspace (for an
    answer given without the loop: `/stop` while the run waits for an approval)."""
    if not details.get(ATTACHMENTS):
        return None

    async def no_count() -> int:
        return 0

    ctx = ToolContext(
        session_id=session_id,
        session_key=session_key,
        channel="",
        chat_id="",
        sender_id="",
        thread_id=None,
        message_count=no_count,
        generation=generation,
    )
    return await answer_parts(details, (), tools, ctx)


def send_file_tool(root: str | Path, *, per_session: bool, max_bytes: int) -> SendFileTool:
    return SendFileTool(Workspace(root, per_session=per_session), max_bytes=max_bytes)
