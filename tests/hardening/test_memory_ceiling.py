"""Memory has a ceiling whatever the work (issue 30): 1,000 sessions each get a 2 MB tool
output; a server process's resident memory grows by less than a stated bound, because
each result is cut to `TOOL_RESULT_MAX_CHARS` before it reaches history or the model.

The model is a real local fake of the OpenAI API (the real SDK talks to it) that asks
every session to read a 2 MB file of the workspace with `read_file`, then answers.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import inbox, messages
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.hardening.test_memory_bounds import rss_mib
from tests.support.servers import ServerProcess, stop_all
from tests.support.webhook import post_webhook

# serial: measures a server's resident memory under a heavy load; slow: 1,000 agent runs.
pytestmark = [pytest.mark.serial, pytest.mark.alone, pytest.mark.slow]

SESSIONS = 1000
OUTPUT_BYTES = 2 * 1024 * 1024
LIMIT = 16_000  # TOOL_RESULT_MAX_CHARS
RUNS_AT_ONCE = 16  # MAX_CONCURRENT_RUNS
# The documented bound (docs/operations.md, "Memory"): a few copies of the largest tool
# output per run at once, plus the cut results kept per session; measured 2026-12-06:
# see the assertion message of a run.
BOUND_MIB = 64 + RUNS_AT_ONCE * 4 * OUTPUT_BYTES / 2**20


def _model(body: dict[str, Any]) -> Reply:
    if body["messages"][-1]["role"] == "tool":
        return text("read it")
    return calls(ToolCall("read_file", {"path": "big.txt", "max_chars": OUTPUT_BYTES + 10}))


def _reset_peak(pid: int) -> None:
    """Measure the peak resident set (VmHWM) from now on."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def _wait_done(pg_url: str, count: int, timeout: float) -> None:
    engine = create_async_engine(pg_url)
    try:
        deadline = time.monotonic() + timeout
        while True:
            async with engine.connect() as conn:
                done = (
                    await conn.execute(
                        select(func.count()).select_from(inbox).where(inbox.c.status == "done")
                    )
                ).scalar_one()
            if done >= count:
                return
            assert time.monotonic() < deadline, f"only {done} of {count} done"
            await asyncio.sleep(0.5)
    finally:
        await engine.dispose()


async def _load(url: str, first: int, count: int) -> None:
    limit = asyncio.Semaphore(32)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> None:
            async with limit:
                resp = await post_webhook(
                    client, url, WEBHOOK_SECRET, {"chat_id": f"m{i}", "sender_id": "u", "text": "read"}
                )
                assert resp.status_code == 202, resp.text

        await asyncio.gather(*(one(i) for i in range(first, first + count)))


async def test_a_thousand_sessions_with_2_mb_tool_outputs_stay_under_the_bound(
    pg_url: str, tmp_path: Path
) -> None:
    (tmp_path / "big.txt").write_text("x" * (OUTPUT_BYTES - 1) + "\n")
    async with FakeOpenAI(default=_model) as fake:
        env = {
            "DATABASE_URL": pg_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "WEBHOOK_SECRET": WEBHOOK_SECRET,
            "CHANNELS": "webhook",
            "LLM_PROVIDER": "openai",
            "LLM_BASE_URL": fake.url,
            "LLM_MODEL": "gpt-test",
            "LLM_STREAM": "false",
            "WORKSPACE_ROOT": str(tmp_path),
            "WORKSPACE_PER_SESSION": "false",
            "TOOL_RESULT_MAX_CHARS": str(LIMIT),
            "MAX_CONCURRENT_RUNS": str(RUNS_AT_ONCE),
            "INBOX_POLL_SECONDS": "0.2",
        }
        server = await asyncio.to_thread(ServerProcess(env).start)
        try:
            assert server.proc is not None
            pid = server.proc.pid
            await _load(server.url, 0, 50)  # warm-up: imports, pools, caches
            await _wait_done(pg_url, 50, timeout=120)
            before = rss_mib(pid)
            _reset_peak(pid)
            started = time.monotonic()
            await _load(server.url, 50, SESSIONS)
            await _wait_done(pg_url, 50 + SESSIONS, timeout=900)
            took = time.monotonic() - started
            peak = rss_mib(pid, "VmHWM") - before
            after = rss_mib(pid) - before
        finally:
            await stop_all(server)
    engine = create_async_engine(pg_url)
    try:
        async with engine.connect() as conn:
            longest = (
                await conn.execute(
                    select(func.max(func.length(messages.c.content))).where(messages.c.role == "tool")
                )
            ).scalar_one()
    finally:
        await engine.dispose()
    sent_longest = max(
        len(m.get("content") or "") for r in fake.requests for m in r.body["messages"] if m["role"] == "tool"
    )
    assert longest < LIMIT + 200 and sent_longest < LIMIT + 200  # cut before history and model
    print(f"\n{SESSIONS} sessions in {took:.0f} s: peak +{peak:.0f} MiB, after +{after:.0f} MiB")
    assert peak < BOUND_MIB, f"peak RSS grew {peak:.0f} MiB (bound {BOUND_MIB:.0f}), after +{after:.0f}"
    assert after < BOUND_MIB, f"RSS stayed {after:.0f} MiB higher"
