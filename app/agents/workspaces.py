"""Clean-up of per-session workspaces (`WORKSPACE_PER_SESSION`).

A session's directory is `WORKSPACE_ROOT/<agent>/<escaped key>/<generation>`
(`app.agent.workspace.session_dir`); the key directory holds the raw key in
`.session-key`. The lifecycle sweep calls `clean_workspaces`: the directory of every
expired or archived generation is removed, or moved under `WORKSPACE_ROOT/.archive`
(`WORKSPACE_CLEANUP`). Nothing of an open session is touched.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import structlog
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.workspace import KEY_FILE
from app.db.models import sessions
from app.sessions.store import SessionStatus

log = structlog.get_logger(__name__)

CLOSED = (SessionStatus.EXPIRED.value, SessionStatus.ARCHIVED.value)
ARCHIVE = ".archive"


def _generation_dirs(root: Path) -> dict[str, dict[int, Path]]:
    found: dict[str, dict[int, Path]] = {}
    for key_file in root.glob(f"*/*/{KEY_FILE}"):
        key = key_file.read_text(encoding="utf-8")
        for gen_dir in key_file.parent.iterdir():
            if gen_dir.is_dir() and gen_dir.name.isdigit():
                found.setdefault(key, {})[int(gen_dir.name)] = gen_dir
    return found


def _clean(base: Path, directory: Path, mode: str) -> None:
    if mode == "archive":
        target = base / ARCHIVE / directory.relative_to(base)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(directory, target)
    else:
        shutil.rmtree(directory, ignore_errors=True)


async def clean_workspaces(engine: AsyncEngine, root: str, mode: str) -> int:
    """Remove or archive the workspaces of closed sessions; how many were."""
    if mode == "keep":
        return 0
    base = await asyncio.to_thread(Path(root).resolve)
    dirs = await asyncio.to_thread(_generation_dirs, base)
    if not dirs:
        return 0
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(sessions.c.key, sessions.c.generation).where(
                sessions.c.key.in_(list(dirs)), sessions.c.status.in_(CLOSED)
            )
        )
        closed = [(r.key, r.generation) for r in rows]
    cleaned = 0
    for key, generation in closed:
        directory = dirs[key].get(generation)
        if directory is None:
            continue
        await asyncio.to_thread(_clean, base, directory, mode)
        cleaned += 1
        log.info("workspace_cleaned", key=key, generation=generation, mode=mode)
    return cleaned
