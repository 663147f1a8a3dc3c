"""End-to-end throughput and latency through the signed webhook, offline provider, PostgreSQL.

    .venv/bin/python -m bench.bench_webhook_e2e [--events 5000] [--sessions 1000]
        [--servers 2] [--concurrency 64] [--warmup 0] [--gc-log]

Starts `--servers` chatgate processes on a throw-away PostgreSQL database, sends
`--events` signed webhook events spread over `--sessions` sessions from this process
(signed before the clock starts, `--concurrency` requests in flight on keep-alive
connections, alternating servers; runs on uvloop, as the servers do), waits until every
event is answered, and prints (with `--warmup N`, N events to other chats go first and
are waited for; only what follows is measured):
- accept throughput and the p50/p99 latency of the 202 answer (inbox commit);
- processing throughput (events answered per second, first accept to last reply);
- p50/p99 end-to-end latency (event accepted → reply committed to the outbox);
- CPU seconds per event of the server processes and of PostgreSQL, from the first request
  until every event is done: less noisy than throughput on a shared machine. A backend
  that exits during the run drops out of the PostgreSQL sum (the servers' pools keep
  theirs);
- lease acquisitions and committed PostgreSQL transactions per event (each acquisition
  bumps a key's fence; transactions from `pg_stat_database`).

With `--gc-log` the servers also log their garbage-collector pauses (see
`bench/gcprobe/sitecustomize.py`), and the script prints the full collections that
happened after start-up, with their pause times.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import uvloop
from sqlalchemy import func, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import inbox, outbox, session_keys
from tests.support.db import postgres_database
from tests.support.servers import ServerProcess

SECRET = "bench-secret"


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


async def run(
    events: int,
    sessions: int,
    servers: int,
    concurrency: int,
    warmup: int,
    gc_log: Path | None,
    *,
    max_runs: int = 64,
    pool: int = 20,
) -> None:
    async with postgres_database() as url:
        env = {
            "DATABASE_URL": url,
            "WEBHOOK_SECRET": SECRET,
            "CHANNELS": "webhook",
            "LOG_LEVEL": "WARNING",
            "MAX_CONCURRENT_RUNS": str(max_runs),
            "DB_POOL_SIZE": str(pool),
        }
        if gc_log is not None:
            env["CHATGATE_GC_LOG"] = str(gc_log)
            env["PYTHONPATH"] = str(Path(__file__).parent / "gcprobe")
        procs = [ServerProcess(env, preloaded=False).start()]  # the first one migrates
        procs += [ServerProcess(env, preloaded=False).start() for _ in range(servers - 1)]
        engine = create_async_engine(url)
        try:
            if warmup:
                # Other chats than the measured ones: the measured events still open their
                # sessions. Only the servers' first contact with the load is left out (pool
                # connections opened, statements prepared and planned).
                await _send(
                    procs, _requests(procs, range(warmup), lambda i: f"warm{i % sessions}"), concurrency, []
                )
                await _wait_done(engine, warmup)
            requests = _requests(procs, range(events), lambda i: f"s{i % sessions}")
            serving_since = time.time()  # start-up's collections are not the load's
            cpu_before = {
                "servers": _cpu_seconds(procs),
                "postgres": _postgres_cpu_seconds(),
                "load": time.process_time(),
            }
            commits_before = await _commits(engine)
            latencies: list[float] = []
            t0 = time.perf_counter()
            await _send(procs, requests, concurrency, latencies)
            accept_seconds = time.perf_counter() - t0
            await _wait_done(engine, warmup + events)
            cpu = {
                "servers": _cpu_seconds(procs) - cpu_before["servers"],
                "postgres": _postgres_cpu_seconds() - cpu_before["postgres"],
                "load": time.process_time() - cpu_before["load"],
            }
            commits = await _commits(engine) - commits_before
            async with engine.connect() as conn:
                acquisitions = (
                    await conn.execute(
                        select(func.coalesce(func.sum(session_keys.c.lease_fence), 0)).where(
                            ~session_keys.c.key.contains("warm")
                        )
                    )
                ).scalar_one()
                rows = (
                    await conn.execute(
                        select(inbox.c.created_at, outbox.c.created_at)
                        .join(outbox, outbox.c.event_id == inbox.c.event_id)
                        .where(~inbox.c.session_key.contains("warm"))
                    )
                ).all()
        finally:
            for proc in procs:
                proc.stop()
            await engine.dispose()

    e2e = [(answered - accepted).total_seconds() * 1000 for accepted, answered in rows]
    first = min(a for a, _ in rows)
    last = max(b for _, b in rows)
    span = (last - first).total_seconds()
    print(f"events {events}, sessions {sessions}, servers {servers}, concurrency {concurrency}")
    print(
        f"accept:     {events / accept_seconds:7.0f} events/s   "
        f"p50 {statistics.median(latencies):6.1f} ms   p99 {_pct(latencies, 0.99):6.1f} ms"
    )
    print(
        f"processing: {len(rows) / span:7.0f} events/s   "
        f"end-to-end p50 {statistics.median(e2e):6.1f} ms   p99 {_pct(e2e, 0.99):6.1f} ms"
    )
    print(
        f"CPU per event: servers {cpu['servers'] / events * 1000:.2f} ms, "
        f"PostgreSQL {cpu['postgres'] / events * 1000:.2f} ms (accept and processing); "
        f"this load generator {cpu['load'] / events * 1000:.2f} ms"
    )
    print(
        f"per event: {acquisitions / events:.2f} lease acquisitions, "
        f"{commits / events:.2f} committed transactions"
    )
    if gc_log is not None:
        _print_gc_pauses(gc_log, serving_since)


def _requests(
    procs: list[ServerProcess],
    numbers: range,
    chat: Callable[[int], str],
    message_id: Callable[[int], str] | None = None,
) -> list[tuple[int, bytes]]:
    """The signed requests, built before the clock starts: (server index, HTTP/1.1 request).

    `message_id`: each event carries the platform's message id (as every platform's does),
    so the gateway deduplicates on it."""
    built = []
    for i in numbers:
        fields = {"chat_id": chat(i), "sender_id": "bench", "text": f"event {i}"}
        if message_id is not None:
            fields["message_id"] = message_id(i)
        body = json.dumps(fields).encode()
        ts = str(int(time.time()))
        sig = hmac.new(SECRET.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
        head = (
            f"POST /channels/webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nX-Chatgate-Timestamp: {ts}\r\n"
            f"X-Chatgate-Signature: sha256={sig}\r\n\r\n"
        )
        built.append((i % len(procs), head.encode() + body))
    return built


async def _send(
    procs: list[ServerProcess],
    requests: list[tuple[int, bytes]],
    concurrency: int,
    latencies: list[float],
) -> None:
    """Send the requests, `concurrency` at a time, each on a keep-alive connection to its server.

    A plain HTTP/1.1 client on asyncio streams: this process shares the machine's cores with
    the servers and PostgreSQL, and a full client library cost it three times the CPU.
    Each server gets its share of the connections and of the requests, in order.
    """
    queues = [iter([r for s, r in requests if s == server]) for server in range(len(procs))]

    async def worker(server: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", procs[server].port)
        try:
            for request in queues[server]:
                started = time.perf_counter()
                writer.write(request)
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                body = await reader.readexactly(length)
                assert head.startswith(b"HTTP/1.1 202"), head + body
                latencies.append((time.perf_counter() - started) * 1000)
        finally:
            writer.close()

    await asyncio.gather(*(worker(w % len(procs)) for w in range(concurrency)))


async def _wait_done(engine: AsyncEngine, events: int) -> None:
    while True:
        async with engine.connect() as conn:
            done = (
                await conn.execute(select(func.count()).select_from(inbox).where(inbox.c.status == "done"))
            ).scalar_one()
        if done >= events:
            return
        await asyncio.sleep(0.2)


async def _commits(engine: AsyncEngine) -> int:
    """Committed transactions of this database so far (the statistics lag by up to ~0.5 s)."""
    async with engine.connect() as conn:
        await conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        return int(
            (
                await conn.execute(
                    text("SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()")
                )
            ).scalar_one()
        )


_TICK = os.sysconf("SC_CLK_TCK")


def _process_cpu(pid: int) -> float:
    """User and system CPU seconds of a live process (Linux /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


def _cpu_seconds(procs: list[ServerProcess]) -> float:
    return sum(_process_cpu(p.proc.pid) for p in procs if p.proc is not None)


def _postgres_cpu_seconds() -> float:
    """CPU seconds of the PostgreSQL processes alive now (backends of the servers included)."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().startswith("postgres"):
                    total += _process_cpu(int(entry.name))
            except OSError:
                continue
    return total


def _print_gc_pauses(directory: Path, since: float) -> None:
    for log in sorted(directory.glob("gc-*.txt")):
        logged = [line.split() for line in log.read_text().splitlines()]
        recent = [(generation, float(ms)) for at, generation, ms in logged if float(at) >= since]
        full = [ms for generation, ms in recent if generation == "2"]
        slow = [ms for generation, ms in recent if generation != "2"]
        print(
            f"server {log.stem[3:]} under load: {len(full)} full collections, "
            f"{sum(full):.0f} ms in all, longest {max(full, default=0):.0f} ms; "
            f"{len(slow)} younger ones over 3 ms"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--warmup", type=int, default=0, help="events sent to other chats first, not measured (default 0)"
    )
    parser.add_argument("--gc-log", action="store_true", help="log the servers' garbage-collector pauses")
    parser.add_argument(
        "--max-runs", type=int, default=64, help="each server's MAX_CONCURRENT_RUNS (default 64)"
    )
    parser.add_argument("--pool", type=int, default=20, help="each server's DB_POOL_SIZE (default 20)")
    args = parser.parse_args()
    limits = {"max_runs": args.max_runs, "pool": args.pool}
    if not args.gc_log:
        uvloop.run(
            run(args.events, args.sessions, args.servers, args.concurrency, args.warmup, None, **limits)
        )
        return
    with tempfile.TemporaryDirectory(prefix="chatgate-gc-") as directory:
        uvloop.run(
            run(
                args.events,
                args.sessions,
                args.servers,
                args.concurrency,
                args.warmup,
                Path(directory),
                **limits,
            )
        )


if __name__ == "__main__":
    main()
