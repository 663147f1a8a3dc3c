"""File tools confined to one directory (`WORKSPACE_ROOT`).

`Workspace.resolve` is the path policy: a path given by the model is taken relative to
the root, every symlink in it is resolved, and the result must still lie inside the
root — so neither `..` nor a symlink pointing outside lets a tool escape. Reading and
listing are safe; writing is risky and goes through the approval gate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, Tool, ToolContext, ToolError


class PathOutsideWorkspace(ToolError):
    pass


class Workspace:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).resolve()

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


def _path_arg(arguments: dict[str, Any], default: str | None = None) -> str:
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
        real = self.workspace.resolve(_path_arg(arguments))
        if not real.is_file():
            raise ToolError(f"no file {self.workspace.display(real)!r}")
        limit = int(arguments.get("max_chars") or 20_000)
        with real.open("r", encoding="utf-8", errors="replace") as fh:
            content = fh.read(limit + 1)
        return json.dumps(
            {
                "path": self.workspace.display(real),
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
        real = self.workspace.resolve(_path_arg(arguments, default=".") or ".")
        if not real.is_dir():
            raise ToolError(f"no directory {self.workspace.display(real)!r}")
        entries = []
        for entry in sorted(os.scandir(real), key=lambda e: e.name)[: self.limit]:
            kind = "dir" if entry.is_dir(follow_symlinks=False) else "file"
            if entry.is_symlink():
                kind = "link"
            entries.append({"name": entry.name, "type": kind})
        return json.dumps({"path": self.workspace.display(real), "entries": entries}, ensure_ascii=False)


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
        real = self.workspace.resolve(_path_arg(arguments))
        content = arguments.get("content")
        if not isinstance(content, str):
            raise ToolError("`content` must be a string")
        if real == self.workspace.root or real.is_dir():
            raise ToolError("cannot write to a directory")
        real.parent.mkdir(parents=True, exist_ok=True)
        # Re-check after creating parents: a parent could have been swapped for a link.
        real = self.workspace.resolve(self.workspace.display(real))
        real.write_text(content, encoding="utf-8")
        return json.dumps({"path": self.workspace.display(real), "bytes": len(content.encode())})


def file_tools(root: str | Path) -> list[Tool]:
    workspace = Workspace(root)
    return [ReadFileTool(workspace), ListFilesTool(workspace), WriteFileTool(workspace)]
