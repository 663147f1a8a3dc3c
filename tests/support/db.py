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

A PostgreSQL database at head is used again by the next test of the same process instead of
being dropped. `DROP DATABASE` makes PostgreSQL take a checkpoint (and an fsync of the whole
cluster that every other test's commits wait behind), and a CREATE copies the template through
the WAL: a create and a drop cost ~200 ms of the cluster's CPU on the suite's 2-CPU machines,
and the suite makes ~800 of them. When a test ends, a thread of its own (the test does not
wait) closes the database to connections, ends whatever is still connected (a server process
of the test), renames it (anything that still holds the old URL cannot reach the next test's
data), checks that its schema is still the template's (a catalog fingerprint: a test that
changed the schema gets its database dropped, not reused) and empties it: DELETE, sequences
back to their start, VACUUM (the tables are 0 pages again), the planner's statistics
forgotten; ~20 ms of CPU (`TRUNCATE` of the 24 tables alone took 110 ms: new files for every
table and index). So the next test gets what a copy of the template would give it: the tables
at head, no rows but the migration's version, sequences from 1. Anything that goes wrong on the
way drops the database. An empty database (`migrated=False`) is dropped after its test, by
a thread of its own as well. `settle()` waits for those threads; the end of the session does.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from app.migrate import upgrade

ADMIN_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_templates: dict[str, str] = {}  # kind -> template database name / file path
_template_lock = asyncio.Lock()
_atexit_registered: list[bool] = []
_free: list[str] = []  # emptied databases at head, ready for the next test
_free_lock = threading.Lock()
_after_tests: list[threading.Thread] = []  # resetting or dropping a finished test's database


@dataclass(frozen=True)
class _Shape:
    """The PostgreSQL template's schema fingerprint and its tables (all but alembic's)."""

    fingerprint: str
    tables: tuple[str, ...]  # `public."a"`, …


_shape: list[_Shape] = []  # the one of this process's template, once it is made

# What a test could change in a database's schema, as one hash: namespaces, relations,
# columns and defaults, constraints, indexes, triggers, functions, types, sequences'
# settings, policies, extensions, event triggers, privileges, per-database settings, and the
# migration's version. Two databases with the same fingerprint answer the app the same way.
_USER = "n.nspname NOT LIKE 'pg\\_%' AND n.nspname <> 'information_schema'"
FINGERPRINT = f"""
SELECT md5(string_agg(x, E'\\n' ORDER BY x)) FROM (
  SELECT 'n ' || n.nspname || coalesce(n.nspacl::text, '') FROM pg_namespace n WHERE {_USER}
  UNION ALL
  SELECT 'c ' || n.nspname || '.' || c.relname || ' ' || c.relkind::text || c.relpersistence::text
         || c.relrowsecurity || coalesce(c.relacl::text, '') || coalesce(c.reloptions::text, '')
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}
  UNION ALL
  SELECT 'a ' || c.oid::regclass::text || ' ' || a.attname || ' '
         || format_type(a.atttypid, a.atttypmod) || a.attnotnull || a.attidentity::text
         || a.attgenerated::text || coalesce(pg_get_expr(d.adbin, d.adrelid), '')
    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
   WHERE {_USER} AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
  SELECT 'k ' || o.conrelid::regclass::text || ' ' || o.conname || ' ' || pg_get_constraintdef(o.oid)
    FROM pg_constraint o JOIN pg_namespace n ON n.oid = o.connamespace WHERE {_USER}
  UNION ALL
  SELECT 'i ' || pg_get_indexdef(i.indexrelid)
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_USER}
  UNION ALL
  SELECT 't ' || pg_get_triggerdef(t.oid) || t.tgenabled::text FROM pg_trigger t WHERE NOT t.tgisinternal
  UNION ALL
  SELECT 'f ' || p.oid::regprocedure::text || md5(p.prosrc)
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_USER}
  UNION ALL
  SELECT 'y ' || t.oid::regtype::text || t.typtype::text
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {_USER}
  UNION ALL
  SELECT 'q ' || s.seqrelid::regclass::text || ' ' || concat_ws(' ', s.seqtypid, s.seqstart,
         s.seqincrement, s.seqmax, s.seqmin, s.seqcache, s.seqcycle) FROM pg_sequence s
  UNION ALL
  SELECT 'p ' || polrelid::regclass::text || ' ' || polname FROM pg_policy
  UNION ALL
  SELECT 'x ' || extname || ' ' || extversion FROM pg_extension
  UNION ALL
  SELECT 'e ' || evtname || evtenabled::text FROM pg_event_trigger
  UNION ALL
  SELECT 's ' || setrole || ' ' || array_to_string(setconfig, ',') FROM pg_db_role_setting
   WHERE setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
  UNION ALL
  SELECT 'v ' || version_num FROM public.alembic_version
) AS parts(x)
"""


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


def _after_test(job: Coroutine[Any, Any, None]) -> None:
    """Run `job` in a thread of its own: the test that ends does not wait for it."""
    _after_tests[:] = [t for t in _after_tests if t.is_alive()]
    thread = threading.Thread(target=asyncio.run, args=(job,), daemon=True)
    thread.start()
    _after_tests.append(thread)


async def _drop(name: str) -> None:
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settle() -> None:
    """Wait until the databases of finished tests are ready for reuse or dropped."""
    for thread in _after_tests:
        thread.join()
    _after_tests.clear()


def drop_templates() -> None:
    """Drop this process's templates and the databases still waiting to be dropped or kept
    for reuse: at the end of the pytest session (an xdist worker may end without running
    atexit handlers), and at exit for anything else that made one."""
    settle()
    with _free_lock:
        names = _free[:]
        _free.clear()
    template = _templates.pop("postgres", None)
    _shape.clear()
    if template:
        names.append(template)
    for name in names:
        asyncio.run(_drop(name))
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
            conn = await asyncpg.connect(_with_database(ADMIN_URL, name))
            try:
                fingerprint = await conn.fetchval(FINGERPRINT)
                tables = await conn.fetch(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                    " AND tablename <> 'alembic_version' ORDER BY tablename"
                )
            finally:
                await conn.close()
            _shape.append(_Shape(fingerprint, tuple(f'public."{row[0]}"' for row in tables)))
        else:
            path = Path(tempfile.mkdtemp(prefix=f"chatgate-template-{_WORKER}-")) / "chatgate.db"
            _templates[kind] = str(path)
            await upgrade(f"sqlite+aiosqlite:///{path}")
        return _templates[kind]


@asynccontextmanager
async def postgres_database(*, migrated: bool = True) -> AsyncIterator[str]:
    """Create a database (at head unless `migrated=False`); yield its URL; drop it afterwards."""
    if migrated:
        template = await _template("postgres")
        with _free_lock:
            name = _free.pop() if _free else None
        if name is None:
            name = _new_name()
            await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        try:
            yield _sqlalchemy_url(name)
        finally:
            _after_test(_reuse_later(name))
        return
    name = _new_name()
    await _admin(f'CREATE DATABASE "{name}"')
    try:
        yield _sqlalchemy_url(name)
    finally:
        _after_test(_drop(name))


def _new_name() -> str:
    return f"chatgate_test_{_WORKER}_{os.getpid()}_{uuid.uuid4().hex[:12]}"


async def _reuse_later(name: str) -> None:
    """Make a finished test's database ready for the next test, or drop it (module doc)."""
    current = name
    try:
        current = await _close_and_rename(name)
        conn = await asyncpg.connect(_with_database(ADMIN_URL, current))
        try:
            shape = _shape[0]
            if await conn.fetchval(FINGERPRINT) != shape.fingerprint:
                raise RuntimeError("the test changed the schema")
            await conn.execute("SET synchronous_commit = off")  # nothing here outlives a crash
            await conn.execute("SET session_replication_role = replica")  # no foreign key order
            # One round trip: a script of several statements runs as one transaction.
            deletes = "".join(f"DELETE FROM {table};" for table in shape.tables)
            await conn.execute(deletes + "SELECT setval(seqrelid, seqstart, false) FROM pg_sequence")
            # VACUUM gives the emptied pages back (a table is 0 pages again, and new rows go
            # where they go in a new database); the planner forgets what it learned.
            await conn.execute(f"VACUUM {', '.join(shape.tables)}")
            await conn.execute(
                "DELETE FROM pg_statistic s USING pg_class c WHERE s.starelid = c.oid"
                " AND c.relnamespace = 'public'::regnamespace;"
                "UPDATE pg_class SET reltuples = -1, relpages = 0, relallvisible = 0"
                " WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'i', 't')"
            )
        finally:
            await conn.close()
    except Exception:  # whatever it was, the database is not reused
        with contextlib.suppress(Exception):
            await _drop(current)
        return
    with _free_lock:
        _free.append(current)


async def _close_and_rename(name: str) -> str:
    """Close `name` to new connections, end the ones it has, and give it a new name."""
    new = _new_name()
    conn = await asyncpg.connect(ADMIN_URL)
    try:
        await conn.execute(f'ALTER DATABASE "{name}" WITH ALLOW_CONNECTIONS false')
        for _ in range(200):  # a terminated backend takes a moment to leave
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = $1 AND pid <> pg_backend_pid()",
                name,
            )
            try:
                await conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{new}"')
                break
            except asyncpg.ObjectInUseError:
                await asyncio.sleep(0.01)
        else:
            raise RuntimeError(f"{name} still has connections")
        await conn.execute(f'ALTER DATABASE "{new}" WITH ALLOW_CONNECTIONS true')
    finally:
        await conn.close()
    return new


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
