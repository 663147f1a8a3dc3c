"""Two runtimes on one PostgreSQL database enforce one count: quotas, pairing, allowlists."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from app.api.app import create_app
from tests.access.support import MeteredModel, code_in, until
from tests.access.test_quotas import T0
from tests.conftest import WEBHOOK_SECRET, make_settings, webhook_settings
from tests.support.servers import RunningApp, serve_in_loop
from tests.support.webhook import post_webhook


@contextlib.asynccontextmanager
async def _replicas(pg_url: str, model: MeteredModel, **channel: Any) -> AsyncIterator[list[RunningApp]]:
    async with contextlib.AsyncExitStack() as stack:
        running = []
        for n in range(2):
            app = create_app(
                make_settings(pg_url, worker_id=f"replica-{n}"),
                channel_settings={"webhook": webhook_settings(**channel)},
                provider=model,
            )
            srv = await stack.enter_async_context(serve_in_loop(app))
            srv.runtime.access.clock = lambda: T0 + 1  # one fixed window on both
            running.append(srv)
        yield running


async def _send(http: httpx.AsyncClient, srv: RunningApp, sender: str, text: str) -> Any:
    body = {"chat_id": f"dm-{sender}", "sender_id": sender, "text": text}
    resp = await post_webhook(http, srv.url, WEBHOOK_SECRET, body, wait=True)
    assert resp.status_code in (200, 202), resp.text
    return resp.json()


async def test_two_replicas_share_message_and_token_counts(pg_url: str) -> None:
    model = MeteredModel(prompt=30, completion=10)
    async with (
        _replicas(pg_url, model, quota_sender_messages_per_minute=3, quota_sender_tokens_per_day=50) as (
            a,
            b,
        ),
        httpx.AsyncClient(timeout=30) as http,
    ):
        # Eight messages of one sender at once, spread over both replicas: three get in.
        answers = await asyncio.gather(*(_send(http, (a, b)[i % 2], "mia", f"m{i}") for i in range(8)))
        assert sum(1 for x in answers if x.get("reason") is None) == 3
        assert sum(1 for x in answers if "notice" in x) == 1
        assert len(model.calls) == 3

        # Tokens counted after a turn on one replica refuse the sender on the other.
        assert (await _send(http, a, "tia", "one")).get("reason") is None
        await until(lambda: _used(a, "tia", 40))
        assert (await _send(http, b, "tia", "two")).get("reason") is None
        await until(lambda: _used(b, "tia", 80))
        refused = [await _send(http, srv, "tia", t) for srv, t in ((a, "three"), (b, "four"))]
        assert [r["reason"] for r in refused] == ["quota", "quota"]
        assert "notice" in refused[0] and "notice" not in refused[1]
        assert model.calls[3:] == ["one", "two"]


async def test_a_code_approved_on_one_replica_admits_on_the_other(pg_url: str) -> None:
    model = MeteredModel()
    async with _replicas(pg_url, model, access="pairing") as (a, b), httpx.AsyncClient(timeout=30) as http:
        asked = await asyncio.gather(_send(http, a, "zoe", "hi"), _send(http, b, "zoe", "hello"))
        codes = [code_in(x["notice"]) for x in asked if "notice" in x]
        assert len(codes) == 1  # racing replicas mint one code
        assert await a.runtime.access.store.approve(codes[0], by="test") is not None
        assert (await _send(http, b, "zoe", "now?"))["replies"][0]["text"] == "echo now?"


async def _used(srv: RunningApp, sender: str, tokens: int) -> bool:
    counters = srv.runtime.access.counters
    subject = f"sender:webhook:{sender}"
    return (await counters.read("tokens", [subject], int(T0))) == {subject: tokens}
