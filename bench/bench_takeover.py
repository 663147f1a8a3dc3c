"""Take-over time: how long a replica's work waits when it is SIGKILLed or SIGTERMed.

Two `chatgate serve` processes on one fresh PostgreSQL database share a load of webhook
events over many keys (the offline model with a fixed latency). Once some are answered,
replica A gets the signal. Printed per round:

- `took`: from the signal until every event unfinished at that moment is answered;
- `A's keys`: keys whose lease A held at the signal;
- `A's keys silent`: the longest time one of them went without an answer after the signal
  (the take-over time a user of a conversation on A sees);
- `worst wait`: the longest accept → answer time of any event of the run;
- for SIGTERM, how long A took to hand over and exit, and its exit status.

    .venv/bin/python -m bench.bench_takeover --rounds 3 --ttl 5

With SIGKILL the take-over waits for the lease TTL (A's leases expire, then one sweep of
the survivor frees all of them); with SIGTERM it should not wait at all.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time

import httpx
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.db.models import inbox, outbox, session_keys, utcnow
from tests.support.db import postgres_database
from tests.support.servers import ServerProcess
from tests.support.webhook import post_webhook

SECRET = "bench-secret"


async def _done(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        query = select(func.count()).select_from(inbox).where(inbox.c.status == "done")
        return int((await conn.execute(query)).scalar_one())


async def _until_done(engine: AsyncEngine, count: int) -> None:
    """Poll the database (the servers are other processes: there is no event to wait on)."""
    while await _done(engine) < count:  # noqa: ASYNC110 - the state lives in another process
        await asyncio.sleep(0.02)


async def _send(urls: list[str], events: int, keys: int) -> None:
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            async with limit:
                body = {"chat_id": f"k{i % keys}", "sender_id": "u", "text": f"m{i}", "message_id": f"m{i}"}
                resp = await post_webhook(client, urls[i % len(urls)], SECRET, body)
                assert resp.status_code == 202, resp.text

        await asyncio.gather(*(one(i) for i in range(events)))


async def one_round(mode: str, *, ttl: float, events: int, keys: int, latency_ms: int) -> dict[str, float]:
    async with postgres_database() as url:
        env = {
            "DATABASE_URL": url,
            "WEBHOOK_SECRET": SECRET,
            "CHANNELS": "webhook",
            "OFFLINE_LATENCY_MS": str(latency_ms),
            "LEASE_TTL_SECONDS": str(ttl),
            "INBOX_POLL_SECONDS": "0.2",
            "OUTBOX_POLL_SECONDS": "0.1",
            "SHUTDOWN_GRACE_SECONDS": "20",
            "WORKER_ID": "replica-a",
        }
        a = await asyncio.to_thread(ServerProcess(env, preloaded=False).start)
        b = await asyncio.to_thread(ServerProcess({**env, "WORKER_ID": "replica-b"}, preloaded=False).start)
        engine = create_async_engine(url)
        try:
            await _send([a.url, b.url], events, keys)
            await _until_done(engine, events // 5)
            async with engine.connect() as conn:
                held_keys = (
                    (
                        await conn.execute(
                            select(session_keys.c.key).where(
                                session_keys.c.lease_owner == "replica-a",
                                session_keys.c.lease_expires_at > utcnow(),
                            )
                        )
                    )
                    .scalars()
                    .all()
                )
            held = len(held_keys)
            assert a.proc is not None
            signalled_at = utcnow()
            signalled = time.monotonic()
            a.proc.send_signal(signal.SIGKILL if mode == "kill" else signal.SIGTERM)
            unfinished = events - await _done(engine)
            exit_status, exited = float("nan"), float("nan")
            if mode == "term":
                exit_status = float(await asyncio.to_thread(a.wait, 60))
                exited = time.monotonic() - signalled
            await _until_done(engine, events)
            took = time.monotonic() - signalled
            async with engine.connect() as conn:
                worst = (
                    await conn.execute(
                        select(func.max(outbox.c.created_at - inbox.c.created_at)).join(
                            inbox, inbox.c.event_id == outbox.c.event_id
                        )
                    )
                ).scalar_one()
                # Each of A's conversations: its first answer after the signal.
                firsts = (
                    (
                        await conn.execute(
                            select(func.min(outbox.c.created_at))
                            .where(outbox.c.session_key.in_(held_keys), outbox.c.created_at > signalled_at)
                            .group_by(outbox.c.session_key)
                        )
                    )
                    .scalars()
                    .all()
                )
            silent = max(((f - signalled_at).total_seconds() for f in firsts), default=float("nan"))
        finally:
            a.kill()
            b.stop()
            await engine.dispose()
    return {
        "took": took,
        "held": float(held),
        "silent": silent,
        "unfinished": float(unfinished),
        "worst": worst.total_seconds(),
        "exited": exited,
        "status": exit_status,
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ttl", type=float, default=5.0, help="LEASE_TTL_SECONDS")
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--keys", type=int, default=60)
    parser.add_argument("--latency-ms", type=int, default=300, help="OFFLINE_LATENCY_MS")
    args = parser.parse_args()
    print(f"lease TTL {args.ttl:g} s, {args.events} events over {args.keys} keys, model {args.latency_ms} ms")
    print(
        "| round | signal | A's keys | A's keys silent | unfinished | took | worst wait | A exited (status) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for n in range(1, args.rounds + 1):
        for mode in ("kill", "term"):
            r = await one_round(
                mode, ttl=args.ttl, events=args.events, keys=args.keys, latency_ms=args.latency_ms
            )
            exited = "—" if mode == "kill" else f"{r['exited']:.2f} s ({r['status']:.0f})"
            print(
                f"| {n} | {'SIGKILL' if mode == 'kill' else 'SIGTERM'} | {r['held']:.0f} "
                f"| {r['silent']:.2f} s "
                f"| {r['unfinished']:.0f} "
                f"| {r['took']:.2f} s | {r['worst']:.2f} s | {exited} |",
                flush=True,
            )


if __name__ == "__main__":
    asyncio.run(main())
