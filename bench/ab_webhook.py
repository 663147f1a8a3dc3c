"""Interleaved A/B pairs of the webhook load against several source trees, on one machine.

    .venv/bin/python -m bench.ab_webhook --tree old=../wt-base-ffe --tree new=. \
        [--pairs 3] [--events 3000] [--sessions 1000] [--concurrency 64] [--warmup 1000] [--sqlite]
        [--message-ids]

Each round runs every tree once (the order alternates between rounds, so a drift of the
machine's load falls on both sides): a fresh database (PostgreSQL, or a SQLite file with
`--sqlite`) migrated by the tree's own server, one `python -m app serve` process started
in that tree, the offline model with its demo pauses off (`OFFLINE_LATENCY_MS=0`,
`OFFLINE_STREAM_DELAY_MS=0`: no sleep is measured), the same signed requests as
`bench_webhook_e2e`. Before each run it prints a calibration (milliseconds of a fixed
pure-Python loop) and the load average: the machine is shared.

The figure to trust on a shared machine is **CPU per event**: the server process's, plus
that of the PostgreSQL backends connected to the run's database (not the whole cluster:
other people's databases run there too). Events/s and latency move with everyone else's load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import uvloop
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine

from app.db.models import inbox, outbox
from bench.bench_webhook_e2e import SECRET, _process_cpu, _requests, _send
from tests.support.db import postgres_database
from tests.support.servers import ServerProcess, _PortTaken

_EVENTS = [1]  # the measured events, for the calls per event


def calibration() -> float:
    """Milliseconds of a fixed pure-Python loop (what one core gives this process now)."""
    started = time.perf_counter()
    total = 0
    for i in range(2_000_000):
        total += i & 7
    return (time.perf_counter() - started) * 1000


@dataclass
class Result:
    tree: str
    events_per_s: float
    server_ms: float
    backends_ms: float
    commits: float
    e2e_p50: float
    accept_p50: float
    db_bytes: float | None
    gc_ms: tuple[float, float, float] | None = None
    gc_counts: tuple[int, int, int] | None = None

    @property
    def cpu_ms(self) -> float:
        return self.server_ms + self.backends_ms


def _py_spy() -> str:
    """py-spy beside the interpreter (installed in the venv), else the one on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy") or str(beside)


def _wait_or_none(proc: subprocess.Popen[bytes], seconds: float) -> int | None:
    try:
        return proc.wait(seconds)
    except subprocess.TimeoutExpired:
        return None


class TreeServer(ServerProcess):
    """`python -m app serve` started in another source tree (its own code and migrations)."""

    def __init__(self, env: dict[str, str], tree: Path) -> None:
        super().__init__(env)
        self.tree = tree

    def _start(self, timeout: float) -> ServerProcess:
        fd, name = tempfile.mkstemp(prefix="chatgate-ab-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(self.port)],
            cwd=self.tree,
            env=self.env,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if "address already in use" in self.log().lower():
                    raise _PortTaken(self.port)
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                ready = httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                ready = False
            # Another process may have taken the port first (and answer): ours then exits.
            if ready and _wait_or_none(self.proc, 1.0) is None:
                return self
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")


async def _backend_pids(engine: AsyncEngine) -> set[int]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text(
                "SELECT pid FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        )
        return {int(r[0]) for r in rows}


async def _commits(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        found = await conn.execute(
            text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
        )
        return int(found.scalar_one())


async def _done(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        found = await conn.execute(select(func.count()).select_from(inbox).where(inbox.c.status == "done"))
        return int(found.scalar_one())


async def _wait_done(engine: AsyncEngine, events: int) -> None:
    while await _done(engine) < events:  # noqa: ASYNC110 - another process's work: polled
        await asyncio.sleep(0.2)


async def _print_statements(conn: AsyncConnection, events: int) -> None:
    """Per event: statements and their execution time in all; the costliest statements."""
    where = "dbid = (SELECT oid FROM pg_database WHERE datname = current_database())"
    calls, ms = (
        await conn.execute(
            text(f"SELECT sum(calls), sum(total_exec_time) FROM pg_stat_statements WHERE {where}")
        )
    ).one()
    print(f"    PostgreSQL: {calls / events:.2f} statements, {ms / events:.3f} ms execution per event")
    top = await conn.execute(
        text(
            "SELECT calls, total_exec_time, mean_exec_time,"
            " left(regexp_replace(query, '\\s+', ' ', 'g'), 90)"
            f" FROM pg_stat_statements WHERE {where} ORDER BY total_exec_time DESC LIMIT 8"
        )
    )
    for n, total, mean, query in top:
        print(f"      {n / events:5.2f}/event {total / events:6.3f} ms/event mean {mean:6.3f} ms  {query}")


async def one_run(name: str, tree: Path, url: str, args: argparse.Namespace) -> Result:
    postgres = url.startswith("postgresql")
    env = {
        "DATABASE_URL": url,
        "WEBHOOK_SECRET": SECRET,
        "CHANNELS": "webhook",
        "LOG_LEVEL": "WARNING",
        "MAX_CONCURRENT_RUNS": "64",
        "DB_POOL_SIZE": "20",
        "OFFLINE_LATENCY_MS": "0",
        "OFFLINE_STREAM_DELAY_MS": "0",
        "PYTHONPATH": str(tree),
    }
    calls = None
    if args.calls:  # Python calls per event in the measured span (cProfile; slows the server)
        calls = Path(tempfile.mkdtemp(prefix="chatgate-ab-calls-")) / "calls.prof"
        env["CHATGATE_CALLS"] = str(calls)
        env["PYTHONPATH"] = os.pathsep.join((str(tree), str(Path(__file__).parent / "gcprobe")))
    gc_totals = None
    if args.gc:  # the garbage collector's work in the measured span (`bench/gcprobe`)
        gc_totals = Path(tempfile.mkdtemp(prefix="chatgate-ab-gc-")) / "totals.txt"
        env["CHATGATE_GC_TOTALS"] = str(gc_totals)
        env["PYTHONPATH"] = os.pathsep.join((str(tree), str(Path(__file__).parent / "gcprobe")))
    server = TreeServer(env, tree).start()
    engine = create_async_engine(url)
    try:
        sessions = args.sessions
        if args.warmup:
            ids = (lambda i: f"warm-{i}") if args.message_ids else None
            warm = _requests([server], range(args.warmup), lambda i: f"warm{i % sessions}", ids)
            await _send([server], warm, args.concurrency, [])
            await _wait_done(engine, args.warmup)
        requests = _requests(
            [server],
            range(args.events),
            lambda i: f"s{i % sessions}",
            (lambda i: f"m-{i}") if args.message_ids else None,
        )
        pids = await _backend_pids(engine) if postgres else set()
        before = {pid: _process_cpu(pid) for pid in pids}
        server_before = _process_cpu(server.proc.pid)  # type: ignore[union-attr]
        if gc_totals is not None:
            await _gc_mark(server.proc.pid, gc_totals, 1)  # type: ignore[union-attr]
        if calls is not None:
            os.kill(server.proc.pid, signal.SIGUSR2)  # type: ignore[union-attr]
        commits_before = await _commits(engine) if postgres else 0
        if args.statements:  # a cluster of one's own with pg_stat_statements preloaded
            async with engine.connect() as conn:
                await conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_stat_statements"))
                await conn.execute(text("SELECT pg_stat_statements_reset()"))
                await conn.commit()
        spy = None
        if args.profile:
            pid = str(server.proc.pid)  # type: ignore[union-attr]
            output = f"{args.profile}/{name}.txt"
            spy_args = ["record", "--pid", pid, "--gil", "--format", "raw", "--rate", "200", "-o", output]
            spy = subprocess.Popen(  # noqa: ASYNC220 - started once, before the load
                [_py_spy(), *spy_args],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        latencies: list[float] = []
        _EVENTS[0] = args.events
        await _send([server], requests, args.concurrency, latencies)
        await _wait_done(engine, args.warmup + args.events)
        server_cpu = _process_cpu(server.proc.pid) - server_before  # type: ignore[union-attr]
        if gc_totals is not None:
            await _gc_mark(server.proc.pid, gc_totals, 2)  # type: ignore[union-attr]
        if calls is not None:
            os.kill(server.proc.pid, signal.SIGUSR2)  # type: ignore[union-attr]
            await _calls_dumped(calls)
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        backends_cpu = 0.0
        if postgres:
            pids |= await _backend_pids(engine)
            backends_cpu = sum(_process_cpu(pid) - before.get(pid, 0.0) for pid in pids)
        commits = (await _commits(engine) - commits_before) if postgres else 0
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(inbox.c.created_at, outbox.c.created_at)
                    .join(outbox, outbox.c.event_id == inbox.c.event_id)
                    .where(~inbox.c.session_key.contains("warm"))
                )
            ).all()
            size = None
            if args.statements:
                await _print_statements(conn, args.events)
            if postgres and args.sizes:
                tables = await conn.execute(
                    text(
                        "SELECT relname, pg_relation_size(relid), pg_indexes_size(relid),"
                        " pg_total_relation_size(relid), n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                        " ORDER BY pg_total_relation_size(relid) DESC LIMIT 8"
                    )
                )
                per = args.events + args.warmup
                for table, heap, indexes, total, updates, hot in tables:
                    print(
                        f"    {table:14} {total / per:7.0f} B/event "
                        f"(rows {heap / per:.0f}, indexes {indexes / per:.0f}, the rest TOAST/FSM/VM); "
                        f"{updates / per:.1f} updates/event, {hot / max(updates, 1):.0%} HOT"
                    )
            if postgres:
                size = (
                    await conn.execute(
                        text("SELECT sum(pg_total_relation_size(relid)) FROM pg_stat_user_tables")
                    )
                ).scalar_one()
    finally:
        server.stop()
        await engine.dispose()
    gc_ms, gc_counts = _gc_spent(gc_totals) if gc_totals is not None else (None, None)
    if gc_totals is not None:
        shutil.rmtree(gc_totals.parent, ignore_errors=True)
    e2e = [(b - a).total_seconds() * 1000 for a, b in rows]
    first = min(a for a, _ in rows)
    last = max(b for _, b in rows)
    n = args.events
    return Result(
        tree=name,
        events_per_s=len(rows) / (last - first).total_seconds(),
        server_ms=server_cpu / n * 1000,
        backends_ms=backends_cpu / n * 1000,
        commits=commits / n,
        e2e_p50=statistics.median(e2e),
        accept_p50=statistics.median(latencies),
        db_bytes=None if size is None else size / (n + args.warmup),
        gc_ms=None if gc_ms is None else (gc_ms[0] / n, gc_ms[1] / n, gc_ms[2] / n),
        gc_counts=gc_counts,
    )


async def _calls_dumped(calls: Path) -> None:
    for _ in range(600):
        if _exists(calls):
            await asyncio.sleep(0.5)  # written by now
            stats = pstats.Stats(str(calls))
            total: int = stats.total_calls  # type: ignore[attr-defined]
            print(f"    {total / _EVENTS[0]:.0f} Python calls per event (cProfile: {calls})")
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the server dumped no profile (bench/gcprobe not loaded?)")


async def _gc_mark(pid: int, totals: Path, lines: int) -> None:
    """Ask the server for its collector totals (SIGUSR1) and wait for the line."""
    os.kill(pid, signal.SIGUSR1)
    for _ in range(100):
        if _lines(totals) >= lines:
            return
        await asyncio.sleep(0.05)
    raise RuntimeError("the server wrote no collector totals (bench/gcprobe not loaded?)")


def _exists(path: Path) -> bool:
    return path.exists()


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _gc_spent(totals: Path) -> tuple[tuple[float, float, float], tuple[int, int, int]]:
    """CPU milliseconds in the collector and collections, per generation, between the marks."""
    first, last = ([float(x) for x in line.split()[1:]] for line in totals.read_text().splitlines()[:2])
    delta = [b - a for a, b in zip(first, last, strict=True)]
    return (delta[1], delta[4], delta[7]), (int(delta[0]), int(delta[3]), int(delta[6]))


async def measure(name: str, tree: Path, args: argparse.Namespace) -> Result:
    if not args.sqlite:
        async with postgres_database(migrated=False) as url:
            return await one_run(name, tree, url, args)
    with tempfile.TemporaryDirectory(prefix="chatgate-ab-") as directory:
        return await one_run(name, tree, f"sqlite+aiosqlite:///{directory}/chatgate.db", args)


def _line(r: Result) -> str:
    size = "" if r.db_bytes is None else f"  {r.db_bytes / 1024:5.1f} KiB/event in the tables"
    if r.gc_ms is not None and r.gc_counts is not None:
        size += (
            f"  GC {sum(r.gc_ms):.3f} ms/event (by generation "
            + "/".join(f"{ms:.3f}" for ms in r.gc_ms)
            + f"; {'/'.join(str(c) for c in r.gc_counts)} collections)"
        )
    return (
        f"{r.tree:>6}: {r.events_per_s:6.0f} ev/s  CPU/event {r.cpu_ms:5.2f} ms "
        f"(server {r.server_ms:.2f} + backends {r.backends_ms:.2f})  "
        f"commits/event {r.commits:.2f}  e2e p50 {r.e2e_p50:7.0f} ms  accept p50 {r.accept_p50:5.1f} ms{size}"
    )


def _trees(given: list[str]) -> list[tuple[str, Path]]:
    return [(name, Path(path).resolve()) for name, path in (t.split("=", 1) for t in given)]


async def main_async(args: argparse.Namespace) -> None:
    trees = _trees(args.tree)
    results: list[Result] = []
    for round_ in range(args.pairs):
        order = trees if round_ % 2 == 0 else list(reversed(trees))
        for name, tree in order:
            print(
                f"round {round_ + 1} {name}: calibration {calibration():.0f} ms, "
                f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
                flush=True,
            )
            result = await measure(name, tree, args)
            results.append(result)
            print(_line(result), flush=True)
    print("medians:")
    for name, _ in trees:
        mine = [r for r in results if r.tree == name]
        print(
            f"{name:>6}: {statistics.median(r.events_per_s for r in mine):6.0f} ev/s  "
            f"CPU/event {statistics.median(r.cpu_ms for r in mine):5.2f} ms  "
            f"commits/event {statistics.median(r.commits for r in mine):.2f}  "
            f"e2e p50 {statistics.median(r.e2e_p50 for r in mine):7.0f} ms"
        )
    base = trees[0][0]
    for name, _ in trees[1:]:
        ratios = [
            (b.cpu_ms / a.cpu_ms, b.events_per_s / a.events_per_s)
            for a, b in zip(
                [r for r in results if r.tree == base], [r for r in results if r.tree == name], strict=True
            )
        ]
        print(
            f"{name}/{base} per pair: CPU/event "
            + ", ".join(f"{c:.2f}" for c, _ in ratios)
            + "; events/s "
            + ", ".join(f"{e:.2f}" for _, e in ratios)
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tree", action="append", required=True, help="name=path; the first is the base")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--events", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--profile", help="a directory: py-spy --gil samples of each server under load")
    parser.add_argument(
        "--statements", action="store_true", help="pg_stat_statements per event (needs it preloaded)"
    )
    parser.add_argument(
        "--calls",
        action="store_true",
        help="count the servers' Python calls per event (cProfile: CPU figures are not comparable then)",
    )
    parser.add_argument(
        "--gc", action="store_true", help="time the servers' garbage collector in the measured span"
    )
    parser.add_argument("--sizes", action="store_true", help="print bytes per event of the largest tables")
    parser.add_argument("--sqlite", action="store_true", help="the embedded store instead of PostgreSQL")
    parser.add_argument(
        "--message-ids",
        action="store_true",
        help="each event carries a platform message id (deduplicated on)",
    )
    uvloop.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
