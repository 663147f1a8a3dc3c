"""schemathesis over the served `/openapi.json`, with the admin token, every operation:
no answer is a 5xx (issue 16). Runs against a real server process, on both backends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings

from tests.conftest import ADMIN_TOKEN
from tests.support.servers import ServerProcess, stop_all

EXAMPLES_PER_OPERATION = 25
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Requested-With": "fuzz"}


def _fuzz(base_url: str) -> tuple[int, list[str]]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    failures: list[str] = []
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()  # type: ignore[union-attr]  # an invalid schema fails the test here

        @settings(
            max_examples=EXAMPLES_PER_OPERATION,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy())
        def check(case: Any) -> None:
            nonlocal calls
            calls += 1
            response = case.call(base_url=base_url, headers=ADMIN, timeout=30)
            if response.status_code >= 500:
                failures.append(
                    f"{case.method} {case.formatted_path} → {response.status_code}: {response.text[:200]}"
                )

        check()
    return calls, failures


async def test_no_operation_answers_5xx(db_url: str) -> None:
    srv = ServerProcess(
        {
            "DATABASE_URL": db_url,
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "ADMIN_MAX_FAILURES": "1000000",
            "WEBHOOK_SECRET": "fuzz-secret",
            "GATEWAY_TOKEN_SECRET": "fuzz-gateway-secret",
            "CHANNELS": "webhook,browser,cron",
        }
    )
    await asyncio.to_thread(srv.start)
    try:
        started = time.monotonic()
        calls, failures = await asyncio.to_thread(_fuzz, srv.url)
        elapsed = time.monotonic() - started
        assert not failures, "\n".join(failures[:20]) + f"\n{srv.log()}"
        assert calls > 200, calls
        print(f"fuzz: {calls} requests in {elapsed:.1f} s")  # speed is a benchmark's business, not a test's
    finally:
        await stop_all(srv)
