"""Gateway overhead per agent turn, with a model that answers instantly, on PostgreSQL.

    .venv/bin/python -m bench.bench_turn_overhead [--turns 400] [--sessions 50] [--history 0]
        [--stream] [--loop uvloop|asyncio]

A throw-away PostgreSQL database is created and dropped. The real runtime (inbox,
dispatcher with fenced leases, turn handler, run loop, outbox, session bus) runs with
the OpenAI provider pointed at the fake OpenAI server of the tests, which answers at
once from its own process (so it does not compete for this process's event loop). Each
turn is accepted into the inbox and timed until its reply is committed and the waiter
woke up (what a `?wait=true` webhook or the CLI waits for), one turn at a time,
round-robin over `--sessions` sessions (`--history`: each already holding that many
messages, so the model's window is long). It also prints the CPU time this process spent
per turn.

Two kinds of turn: a plain answer (one model call) and a turn with one tool call
(model → current_time → model). For each it prints p50/p99 of

- total: the whole turn, with the fake model's HTTP round trips included;
- overhead: total minus the time spent inside the provider's `complete` (SDK, HTTP and
  the fake server), i.e. what chatgate itself adds per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import platform
import statistics
import time
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from app.agent.openai_provider import OpenAIProvider
from app.agent.provider import DeltaCallback, ProviderReply, ToolSpec
from app.config import Settings
from app.events import InboundEvent
from app.logs import configure_logging
from app.runtime import Runtime
from app.sessions.messages import ChatMessage
from channels.webhook import WebhookSettings
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.support.db import postgres_database


class TimedProvider:
    """Delegates to the real provider and adds up the time spent inside it."""

    def __init__(self, inner: OpenAIProvider) -> None:
        self.inner = inner
        self.name = inner.name
        self.spent = 0.0

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ProviderReply:
        started = time.perf_counter()
        try:
            return await self.inner.complete(messages, tools, model=model, on_delta=on_delta)
        finally:
            self.spent += time.perf_counter() - started

    async def aclose(self) -> None:
        await self.inner.aclose()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _answer(body: dict[str, Any]) -> Reply:
    """Instant answers: "tool …" turns call current_time first, everything else is text."""
    last = body["messages"][-1]
    if last["role"] == "user" and str(last["content"]).startswith("tool"):
        return calls(ToolCall("current_time", {}, id=f"call_{uuid.uuid4().hex[:8]}"))
    if last["role"] == "tool":
        return text("It is now.")
    return text("Hello there, this is a short answer.")


def _serve_fake(port_out: Any) -> None:
    async def run() -> None:
        async with FakeOpenAI(default=_answer) as fake:
            fake.requests = _Forgetful()
            port_out.put(fake.url)
            await asyncio.Event().wait()

    asyncio.run(run())


class _Forgetful(list):  # type: ignore[type-arg]
    """The fake keeps no request log here: a long run would only grow memory."""

    def append(self, item: Any) -> None:
        return None


async def _turns(
    runtime: Runtime, provider: TimedProvider, *, kind: str, turns: int, sessions: int
) -> tuple[list[float], list[float]]:
    totals, overheads = [], []
    for i in range(turns):
        event = InboundEvent.from_text("webhook", f"{kind}-{i % sessions}", "bench", f"{kind} turn {i}")
        provider.spent = 0.0
        started = time.perf_counter()
        [accepted] = await runtime.ingest.submit([event])
        result = await runtime.waiters.wait_for_replies(accepted.event_id, 30, poll=0.5)
        total = time.perf_counter() - started
        assert result.done and result.replies, result
        totals.append(total * 1000)
        overheads.append((total - provider.spent) * 1000)
    return totals, overheads


async def main(args: argparse.Namespace) -> None:
    configure_logging("WARNING", "console")
    queue: multiprocessing.Queue[str] = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve_fake, args=(queue,), daemon=True)
    server.start()
    try:
        fake_url = await asyncio.to_thread(queue.get, True, 30)
        results = await _measure(args, fake_url)
    finally:
        server.terminate()
        server.join(5)
    print(
        f"python {platform.python_version()}, {args.loop}, PostgreSQL, stream={args.stream}, "
        f"turns={args.turns}, history={args.history}, "
        f"synchronous_commit={'on' if args.sync_commit else 'off'}"
    )
    print(f"{'turn':<6} {'metric':<9} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
    for kind, (totals, overheads) in results.items():
        for name, values in (("total", totals), ("overhead", overheads)):
            print(
                f"{kind:<6} {name:<9} {_pct(values, 0.5):8.2f} {_pct(values, 0.99):8.2f} "
                f"{statistics.fmean(values):8.2f}"
            )


async def _measure(args: argparse.Namespace, fake_url: str) -> dict[str, Any]:
    async with postgres_database() as url:
        if not args.sync_commit:
            # Shows how much of a turn is WAL fsync: commits no longer wait for the disk
            # (not for production: a database crash may lose the newest commits).
            admin = await asyncpg.connect(url.replace("postgresql+asyncpg://", "postgresql://"))
            try:
                await admin.execute(f'ALTER DATABASE "{url.rsplit("/", 1)[1]}" SET synchronous_commit = off')
            finally:
                await admin.close()
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            database_url=url,
            log_level="WARNING",
            llm_provider="openai",
            llm_base_url=fake_url,
            llm_api_key="sk-bench",
            llm_stream=args.stream,
            lifecycle_sweep_seconds=3600,
            inbox_poll_seconds=1.0,
        )
        provider = TimedProvider(OpenAIProvider.from_settings(settings))
        channel = WebhookSettings(_env_file=None, secret="bench")  # type: ignore[call-arg]
        runtime = Runtime(settings, channel_settings={"webhook": channel}, provider=provider)
        async with runtime:
            # Warm-up; with --history, enough plain turns to give each session that many
            # messages (a turn adds two), so the model sees long windows.
            warm = max(30, args.sessions * args.history // 2)
            await _turns(runtime, provider, kind="plain", turns=warm, sessions=args.sessions)
            cpu = time.process_time()
            results: dict[str, Any] = {}
            for kind in ("plain", "tool"):
                results[kind] = await _turns(
                    runtime, provider, kind=kind, turns=args.turns, sessions=args.sessions
                )
            cpu_ms = (time.process_time() - cpu) * 1000 / (2 * args.turns)
    print(f"CPU time of this process per turn (gateway + SDK): {cpu_ms:.1f} ms")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument(
        "--history", type=int, default=0, help="messages in each session before measuring (default 0)"
    )
    parser.add_argument("--stream", action="store_true", help="stream answers (default: whole answers)")
    parser.add_argument(
        "--no-sync-commit",
        dest="sync_commit",
        action="store_false",
        help="run with synchronous_commit=off to separate WAL fsync time from the rest",
    )
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop (default: uvloop, which `chatgate serve` runs on through uvicorn)",
    )
    parsed = parser.parse_args()
    if parsed.loop == "uvloop":
        import uvloop

        uvloop.run(main(parsed))
    else:
        asyncio.run(main(parsed))
