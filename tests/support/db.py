"""Throw-away databases: a SQLite file or a fresh PostgreSQL database per test.

PostgreSQL tests never skip: if the server is not reachable they fail, so CI cannot
pass without them. `TEST_POSTGRES_URL` points at the server (default: local, trust auth).

Each database is a copy of one migrated at head once per test process (PostgreSQL:
`CREATE DATABASE … TEMPLATE`; SQLite: a copy of the file), so a test pays for a copy
instead of the whole migration history; `migrated=False` gives an empty one.

Under pytest-xdist every worker is its own process with its own template: template and
copy names carry the worker id (`gw0`, …; `main` without xdist) and the process id, so
workers never share, race for or drop each other's databases (PostgreSQL refuses to
copy a template another session is connected to).

`DROP DATABASE` makes PostgreSQL take a checkpoint (0.2-1 s, and an fsync of the whole
cluster that every other test's commits wait behind). Under xdist a test's database is
therefore dropped after the test, not in its teardown: the names are collected and
dropped `DROP_BATCH` at a time, concurrently (concurrent drops share their checkpoints),
by a thread of their own, and the rest when the session ends. Without xdist (the serial
phase, timing-sensitive; a developer's run) each one is dropped in its teardown, as before.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg

from app.migrate import upgrade

ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_templates: dict[str, str] = {}  # kind -> template database name / file path
_template_lock = asyncio.Lock()
_atexit_registered: list[bool] = []
DROP_BATCH = 8
_DEFER_DROPS = "PYTEST_XDIST_WORKER" in os.environ
_to_drop: list[str] = []  # databases of finished tests, not dropped yet
_droppers: list[threading.Thread] = []


def _with_database(url: str, name: str) -> str:
    base = url.rsplit("/", 1)[0]
    return f"{base}/{name}"


def _sqlalchemy_url(name: str) -> str:
    return _with_database(ADMIN_URL, name).replace("postgresql://", "postgresql+asyncpg://", 1)


async def _admin(sql: str) -> None:
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def _drop_all(names: list[str]) -> None:
    # One connection, one drop after another: each DROP is a checkpoint anyway, and the
    # suite's workers and servers share the cluster's `max_connections` (100 by default).
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


def _drop_later(name: str) -> None:
    _to_drop.append(name)
    if len(_to_drop) >= DROP_BATCH:
        batch = _to_drop[:]
        _to_drop.clear()
        _droppers[:] = [t for t in _droppers if t.is_alive()]
        thread = threading.Thread(target=asyncio.run, args=(_drop_all(batch),), daemon=True)
        thread.start()
        _droppers.append(thread)


def drop_templates() -> None:
    """Drop this process's templates and the databases still waiting to be dropped: at the
    end of the pytest session (an xdist worker may end without running atexit handlers),
    and at exit for anything else that made one."""
    for thread in _droppers:
        thread.join()
    _droppers.clear()
    if _to_drop:
        asyncio.run(_drop_all(_to_drop[:]))
        _to_drop.clear()
    name = _templates.pop("postgres", None)
    if name:
        asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    path = _templates.pop("sqlite", None)
    if path:
        shutil.rmtree(Path(path).parent, ignore_errors=True)


async def _template(kind: str) -> str:
    async with _template_lock:
        if kind in _templates:
            return _templates[kind]
        if not _atexit_registered:
            _atexit_registered.append(True)
            atexit.register(drop_templates)
        if kind == "postgres":
            name = f"chatgate_template_{_WORKER}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            await _admin(f'CREATE DATABASE "{name}"')
            _templates[kind] = name
            await upgrade(_sqlalchemy_url(name))
        else:
            path = Path(tempfile.mkdtemp(prefix=f"chatgate-template-{_WORKER}-")) / "chatgate.db"
            _templates[kind] = str(path)
            await upgrade(f"sqlite+aiosqlite:///{path}")
        return _templates[kind]


@asynccontextmanager
async def postgres_database(*, migrated: bool = True) -> AsyncIterator[str]:
    """Create a database (at head unless `migrated=False`); yield its URL; drop it afterwards."""
    name = f"chatgate_test_{_WORKER}_{os.getpid()}_{uuid.uuid4().hex[:12]}"
    template = f' TEMPLATE "{await _template("postgres")}"' if migrated else ""
    await _admin(f'CREATE DATABASE "{name}"{template}')
    try:
        yield _sqlalchemy_url(name)
    finally:
        if _DEFER_DROPS:
            _drop_later(name)
        else:
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def sqlite_database(directory: Path, *, migrated: bool = True) -> AsyncIterator[str]:
    path = directory / "chatgate.db"
    if migrated:
        shutil.copyfile(await _template("sqlite"), path)
    yield f"sqlite+aiosqlite:///{path}"


@asynccontextmanager
async def database(kind: str, directory: Path, *, migrated: bool = True) -> AsyncIterator[str]:
    if kind == "postgres":
        async with postgres_database(migrated=migrated) as url:
            yield url
    else:
        async with sqlite_database(directory, migrated=migrated) as url:
            yield url
