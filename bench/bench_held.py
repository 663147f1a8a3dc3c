"""What one webhook costs in the app's ASGI stack, without a server and without the pipeline.

    cd <tree> && PYTHONPATH=<tree> <main tree>/.venv/bin/python /path/to/bench/bench_held.py [--requests 1000]

Runs against the tree it is started in (its `app` on PYTHONPATH), so two trees can be
compared with the same script. The real app on a fresh PostgreSQL database, its runtime
started; the webhook adapter's `handle_request` is replaced by a gate, so what is measured
is the way from the ASGI call to the adapter and back:

- **objects held**: GC-tracked objects alive per webhook while `--requests` of them wait in
  the adapter at once (`gc.get_objects(generation=0)` with the collector off). Objects a
  request holds while it waits count towards the collector's next young pass; under load
  that is where a deeper stack costs (bench/RESULTS.md, "The mount's cost");
- **CPU per webhook**: process time of 2,000 sequential requests, collector off, min of 5.

With `--types` it lists what a waiting webhook holds, by type (coroutines by name).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import os
import time
from typing import Any

import uvloop

from app.api.app import create_app
from app.channel import ChannelRequest, ChannelResponse
from app.config import Settings
from tests.support.db import postgres_database

SETTINGS = {
    "WEBHOOK_SECRET": "s",
    "CHANNELS": "webhook",
    "DB_POOL_SIZE": "5",
    "LOG_LEVEL": "WARNING",
    "OFFLINE_LATENCY_MS": "0",
    "OFFLINE_STREAM_DELAY_MS": "0",
}

BODY = b'{"chat_id": "c", "sender_id": "b", "text": "e"}'


def _scope() -> dict[str, Any]:
    headers = [
        (b"host", b"127.0.0.1"),
        (b"content-type", b"application/json"),
        (b"content-length", str(len(BODY)).encode()),
    ]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "server": ("127.0.0.1", 8000),
        "client": ("127.0.0.1", 5555),
        "scheme": "http",
        "method": "POST",
        "root_path": "",
        "path": "/channels/webhook",
        "raw_path": b"/channels/webhook",
        "query_string": b"",
        "headers": headers,
        "state": {},
    }


async def _call(app: Any) -> int:
    sent = [False]

    async def receive() -> dict[str, Any]:
        if not sent[0]:
            sent[0] = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    status: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(_scope(), receive, send)
    return status[0]


def _label(o: object) -> str:
    kind = type(o).__name__
    if kind in ("function", "coroutine"):
        return f"{kind} {getattr(o, '__qualname__', '?')}"
    return type(o).__qualname__


async def measure(requests: int, types: bool) -> None:
    async with postgres_database(migrated=False) as url:
        os.environ.update(SETTINGS, DATABASE_URL=url)
        app = create_app(Settings())
        async with app.router.lifespan_context(app):
            gate = asyncio.Event()
            all_inside = asyncio.Event()
            inside = [0]

            async def handle_request(_request: ChannelRequest) -> ChannelResponse:
                inside[0] += 1
                if inside[0] == requests:
                    all_inside.set()
                if not gate.is_set():
                    await gate.wait()
                return ChannelResponse.json({"ok": True}, 202)

            app.state.runtime.adapters["webhook"].handle_request = handle_request
            gate.set()
            for _ in range(500):  # warm: the stack built, caches filled
                await _call(app)
            gate.clear()
            inside[0] = 0
            all_inside.clear()
            gc.collect()
            gc.disable()
            base = len(gc.get_objects())
            waiting = [asyncio.ensure_future(_call(app)) for _ in range(requests)]
            await all_inside.wait()
            held = len(gc.get_objects()) - base
            kinds = collections.Counter(_label(o) for o in gc.get_objects(generation=0))
            gate.set()
            statuses = collections.Counter(await asyncio.gather(*waiting))
            del waiting
            gc.collect()
            rounds = []
            for _ in range(5):
                started = time.process_time()
                for _ in range(2000):
                    await _call(app)
                rounds.append((time.process_time() - started) / 2000 * 1e6)
            gc.enable()
    print(
        f"statuses {dict(statuses)}; held per waiting webhook: {held / requests:.1f} GC-tracked objects; "
        f"CPU per webhook min {min(rounds):.1f} µs ({', '.join(f'{r:.1f}' for r in rounds)})"
    )
    if types:
        for kind, n in kinds.most_common():
            if n / requests >= 0.5:
                print(f"  {n / requests:6.2f} {kind}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--types", action="store_true", help="list what a waiting webhook holds")
    args = parser.parse_args()
    uvloop.run(measure(args.requests, args.types))


if __name__ == "__main__":
    main()
