"""File tools confined to one directory (`WORKSPACE_ROOT`).

`Workspace.resolve` is the path policy: a path given by the model is taken relative to
the root, every symlink in it is resolved, and the result must still lie inside the
root — so neither `..` nor a symlink pointing outside lets a tool escape. Reading and
listing are safe; writing is risky and goes through the approval gate.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, Tool, ToolContext, ToolError
from app.events import DEFAULT_AGENT, agent_in_key

KEY_FILE = ".session-key"  # in each per-session key directory


class PathOutsideWorkspace(ToolError):
    pass


class Workspace:
    def __init__(self, root: str | Path, *, per_session: bool = False) -> None:
        self.root = Path(root).resolve()
        self.per_session = per_session

    def scoped(self, ctx: ToolContext) -> Workspace:
        """The workspace a tool call may use: with `per_session`, the session's own
        directory (`session_dir`, created on first use), else the root."""
        if not self.per_session:
            return self
        return self.for_session(ctx.session_key, ctx.generation)

    def for_session(self, session_key: str, generation: int) -> Workspace:
        """The per-session directory of one session generation (created on first use)."""
        directory = self.root / session_dir(session_key, generation)
        if not directory.is_dir():
            directory.mkdir(parents=True, exist_ok=True)
            # The key, for the clean-up (`app.agents.workspaces`): a long one is hashed.
            (directory.parent / KEY_FILE).write_text(session_key, encoding="utf-8")
        return Workspace(directory)

    def resolve(self, path: str) -> Path:
        """The real path of `path` inside the root; `PathOutsideWorkspace` if it escapes."""
        if "\x00" in path:
            raise PathOutsideWorkspace("path contains a NUL byte")
        candidate = Path(path)
        if candidate.is_absolute():
            candidate = candidate.relative_to(candidate.anchor)
        # strict=False: a file about to be written need not exist; its parents are
        # still resolved through any symlink.
        real = (self.root / candidate).resolve(strict=False)
        if real != self.root and not real.is_relative_to(self.root):
            raise PathOutsideWorkspace(f"{path!r} is outside the workspace")
        return real

    def display(self, real: Path) -> str:
        rel = real.relative_to(self.root).as_posix()
        return rel or "."


def escape_dir(value: str) -> str:
    """A path component naming `value`, reversible while short, hashed when long."""
    escaped = quote(value, safe="") or "%"
    if escaped in (".", ".."):
        escaped = escaped.replace(".", "%2E")
    if len(escaped) > 180:
        escaped = escaped[:120] + "~" + hashlib.sha256(value.encode()).hexdigest()[:32]
    return escaped


def session_dir(session_key: str, generation: int) -> Path:
    """`<agent>/<escaped key>/<generation>` under the workspace root."""
    agent = agent_in_key(session_key) or DEFAULT_AGENT
    return Path(escape_dir(agent)) / escape_dir(session_key) / str(generation)


def path_arg(arguments: dict[str, Any], default: str | None = None) -> str:
    value = arguments.get("path", default)
    if not isinstance(value, str) or (not value and default is None):
        raise ToolError("`path` must be a non-empty string")
    return value


class ReadFileTool:
    spec = ToolSpec(
        name="read_file",
        description="Read a text file from the workspace (paths are relative to the workspace root).",
        parameters={
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "max_chars": {"type": "integer", "minimum": 1, "description": "default 20000"},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        workspace = self.workspace.scoped(ctx)
        real = workspace.resolve(path_arg(arguments))
        if not real.is_file():
            raise ToolError(f"no file {workspace.display(real)!r}")
        limit = int(arguments.get("max_chars") or 20_000)
        with real.open("r", encoding="utf-8", errors="replace") as fh:
            content = fh.read(limit + 1)
        return json.dumps(
            {
                "path": workspace.display(real),
                "content": content[:limit],
                "truncated": len(content) > limit,
            },
            ensure_ascii=False,
        )


class ListFilesTool:
    spec = ToolSpec(
        name="list_files",
        description="List the entries of a workspace directory.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string", "description": "default: the workspace root"}},
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, workspace: Workspace, limit: int = 500) -> None:
        self.workspace = workspace
        self.limit = limit

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        workspace = self.workspace.scoped(ctx)
        real = workspace.resolve(path_arg(arguments, default=".") or ".")
        if not real.is_dir():
            raise ToolError(f"no directory {workspace.display(real)!r}")
        entries = []
        for entry in sorted(os.scandir(real), key=lambda e: e.name)[: self.limit]:
            kind = "dir" if entry.is_dir(follow_symlinks=False) else "file"
            if entry.is_symlink():
                kind = "link"
            entries.append({"name": entry.name, "type": kind})
        return json.dumps({"path": workspace.display(real), "entries": entries}, ensure_ascii=False)


class WriteFileTool:
    spec = ToolSpec(
        name="write_file",
        description="Create or overwrite a text file in the workspace. Needs a human's approval.",
        parameters={
            "type": "object",
            "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
            "required": ["path", "content"],
            "additionalProperties": False,
        },
    )
    risk = Risk.RISKY

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        workspace = self.workspace.scoped(ctx)
        real = workspace.resolve(path_arg(arguments))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("`content` must be a string")
        if real == workspace.root or real.is_dir():
            raise ToolError("cannot write to a directory")
        real.parent.mkdir(parents=True, exist_ok=True)
        # Re-check after creating parents: a parent could have been swapped for a link.
        real = workspace.resolve(workspace.display(real))
        real.write_text(content, encoding="utf-8")
        return json.dumps({"path": workspace.display(real), "bytes": len(content.encode())})


def file_tools(root: str | Path, *, per_session: bool = False) -> list[Tool]:
    workspace = Workspace(root, per_session=per_session)
    return [ReadFileTool(workspace), ListFilesTool(workspace), WriteFileTool(workspace)]
