"""Append and window-load cost against history length, on SQLite and PostgreSQL.

    .venv/bin/python -m bench.bench_storage [--sizes 100 100000] [--repeat 300]

For each backend and size it builds one session with that many messages, then times
(a) appending one message the way a worker does (fence check + seq bump + insert, one
transaction) and (b) loading the model window (newest 100 messages, trimmed to a legal
start). A naive baseline that keeps the whole history in one JSON row and rewrites it
on every append — what a session-file runtime does — is timed beside them, so the
ratio is visible in the same run. Prints medians and p90 in milliseconds and the
large/small ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sqlalchemy import JSON, Column, Integer, MetaData, Table, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.db.engine import create_engine
from app.db.models import messages, utcnow
from app.migrate import upgrade
from app.sessions import lease as leases
from app.sessions.messages import ChatMessage
from app.sessions.store import Lifecycle, SessionState, SessionStore
from tests.support.db import postgres_database

baseline_meta = MetaData()
blob_sessions = Table(
    "bench_blob_sessions", baseline_meta, Column("id", Integer, primary_key=True), Column("history", JSON)
)


async def _fill(engine: AsyncEngine, store: SessionStore, key: str, size: int) -> SessionState:
    async with engine.begin() as conn:
        session = await store.open_current(conn, key, "bench")
    now = utcnow()
    chunk = 5000
    for start in range(0, size, chunk):
        n = min(chunk, size - start)
        rows = [
            {
                "session_id": session.id,
                "seq": start + i + 1,
                "role": "user" if (start + i) % 2 == 0 else "assistant",
                "content": f"message {start + i} " + "lorem ipsum " * 8,
                "created_at": now,
            }
            for i in range(n)
        ]
        async with engine.begin() as conn:
            await conn.execute(messages.insert(), rows)
    async with engine.begin() as conn:
        await conn.execute(
            text("UPDATE sessions SET next_seq = :n WHERE id = :id"), {"n": size + 1, "id": session.id}
        )
    return session


async def _time_interleaved(
    fns: dict[int, Callable[[], Awaitable[object]]], repeat: int
) -> dict[int, list[float]]:
    """Time each size's operation in turn, round-robin, so machine noise hits all alike."""
    for fn in fns.values():
        for _ in range(10):  # warm up connections and statement caches
            await fn()
    samples: dict[int, list[float]] = {size: [] for size in fns}
    for _ in range(repeat):
        for size, fn in fns.items():
            started = time.perf_counter()
            await fn()
            samples[size].append((time.perf_counter() - started) * 1000)
    return samples


def _stats(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9)]


async def bench_backend(name: str, url: str, sizes: list[int], repeat: int) -> dict[str, dict[int, float]]:
    await upgrade(url)
    engine = create_engine(Settings(_env_file=None, database_url=url))  # type: ignore[call-arg]
    store = SessionStore(engine, Lifecycle(expire_after=1e9, suspend_after=1e9))
    async with engine.begin() as conn:
        await conn.run_sync(baseline_meta.create_all)
    ops: dict[str, dict[int, Callable[[], Awaitable[object]]]] = {"append": {}, "window": {}, "rewrite": {}}
    message = ChatMessage(role="user", content="one more message " + "lorem ipsum " * 8)
    try:
        for size in sizes:
            key = f"bench:{size}"
            session = await _fill(engine, store, key, size)
            lease = await leases.acquire(engine, key, "bench", ttl=3600)
            assert lease is not None

            async def append(session_id: int = session.id, lease: leases.SessionLease = lease) -> None:
                async with engine.begin() as conn:
                    await leases.check_fence(conn, lease)
                    await store.append(conn, session_id, [message])

            async def window(session: SessionState = session) -> None:
                await store.load_window(session, max_messages=100)

            blob = [{"role": "user", "content": f"message {i} " + "lorem ipsum " * 8} for i in range(size)]
            async with engine.begin() as conn:
                await conn.execute(blob_sessions.insert().values(id=size, history=blob))

            async def rewrite(size: int = size) -> None:
                # The naive way: load the whole history, add one message, write it all back.
                async with engine.begin() as conn:
                    history = (
                        await conn.execute(select(blob_sessions.c.history).where(blob_sessions.c.id == size))
                    ).scalar_one()
                    history.append({"role": "user", "content": "one more"})
                    await conn.execute(
                        update(blob_sessions).where(blob_sessions.c.id == size).values(history=history)
                    )

            ops["append"][size] = append
            ops["window"][size] = window
            ops["rewrite"][size] = rewrite
        async with engine.begin() as conn:  # start from a settled database
            if engine.dialect.name == "sqlite":
                await conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        if engine.dialect.name == "postgresql":
            async with engine.connect() as conn:
                await conn.execution_options(isolation_level="AUTOCOMMIT")
                await conn.execute(text("VACUUM ANALYZE"))
        results: dict[str, dict[int, float]] = {}
        for label, fns in ops.items():
            reps = max(5, repeat // 30) if label == "rewrite" and max(sizes) > 10_000 else repeat
            samples = await _time_interleaved(fns, reps)
            results[label] = {}
            for size in sizes:
                median, p90 = _stats(samples[size])
                results[label][size] = median
                print(
                    f"{name:8} {label:8} {size:>8} msgs  median {median:8.3f} ms  p90 {p90:8.3f} ms  n={reps}"
                )
    finally:
        await engine.dispose()
    small, large = min(sizes), max(sizes)
    for label in ("append", "window", "rewrite"):
        ratio = results[label][large] / results[label][small]
        print(f"{name:8} {label:8} ratio {large}/{small}: {ratio:.2f}x")
    return results


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 100_000])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    args = parser.parse_args()
    if "sqlite" in args.backends:
        with tempfile.TemporaryDirectory() as tmp:
            await bench_backend(
                "sqlite", f"sqlite+aiosqlite:///{Path(tmp) / 'bench.db'}", args.sizes, args.repeat
            )
    if "postgres" in args.backends:
        async with postgres_database() as url:
            await bench_backend("postgres", url, args.sizes, args.repeat)


if __name__ == "__main__":
    asyncio.run(main())
