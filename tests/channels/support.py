"""What the channel tests share: reading the app's tables, waiting for the inbox and
outbox to settle, a session's history through the admin API, a context for send tests."""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy import func, select

from app.channel import AcceptResult, ChannelContext, WaitResult
from app.db.models import inbox, messages, outbox
from app.events import InboundEvent
from tests.conftest import ADMIN_TOKEN
from tests.fakes.openai_server import FakeOpenAI
from tests.support.timing import scaled


async def count(runtime: Any, table: Any, *where: Any) -> int:
    """Rows of `table`, all of them or those matching every condition in `where`."""
    query = select(func.count()).select_from(table)
    for cond in where:
        query = query.where(cond)
    async with runtime.engine.connect() as conn:
        return int((await conn.execute(query)).scalar_one())


async def inbox_keys(runtime: Any) -> list[str]:
    async with runtime.engine.connect() as conn:
        return [r[0] for r in await conn.execute(select(inbox.c.session_key).order_by(inbox.c.id))]


async def outbox_rows(runtime: Any) -> list[dict[str, Any]]:
    async with runtime.engine.connect() as conn:
        rows = (await conn.execute(select(outbox).order_by(outbox.c.id))).mappings().all()
    return [dict(r) for r in rows]


async def wait_outbox_final(runtime: Any, count: int = 1, timeout: float = 15) -> list[dict[str, Any]]:
    """Wait until `count` outbox rows are sent or failed; return all rows."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while True:
        rows = await outbox_rows(runtime)
        final = [r for r in rows if r["status"] in ("sent", "failed")]
        if len(final) >= count:
            return rows
        if loop.time() > deadline:
            raise AssertionError(f"outbox not final in {scaled(timeout):g}s: {rows}")
        await asyncio.sleep(0.05)


async def settled_outbox(runtime: Any, timeout: float = 15) -> list[Any]:
    """The outbox rows once none is pending or being sent (delivery finished either way)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while True:
        async with runtime.engine.connect() as conn:
            rows = list(
                await conn.execute(
                    select(outbox.c.status, outbox.c.attempts, outbox.c.last_error).order_by(outbox.c.id)
                )
            )
        if rows and all(r.status in ("sent", "failed") for r in rows):
            return rows
        if loop.time() > deadline:
            raise AssertionError(f"outbox did not settle: {rows}")
        await asyncio.sleep(0.05)


async def wait_inbox_done(runtime: Any, timeout: float = 15) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + scaled(timeout)
    while True:
        open_rows = await count(runtime, inbox, inbox.c.status.in_(("pending", "processing")))
        if open_rows == 0:
            return
        if loop.time() > deadline:
            raise AssertionError("inbox not drained")
        await asyncio.sleep(0.05)


async def session_messages(client: httpx.AsyncClient, base_url: str, key: str) -> list[dict[str, Any]]:
    """A session's stored messages, read through the admin API."""
    resp = await client.get(
        f"{base_url}/admin/api/sessions/{urllib.parse.quote(key, safe='')}/messages",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert resp.status_code == 200, resp.text
    return list(resp.json()["messages"])


def send_only_context(http: httpx.AsyncClient) -> ChannelContext:
    """A context for tests of an adapter's sending side: accepting or waiting fails the test."""

    async def no_accept(events: Sequence[InboundEvent]) -> list[AcceptResult]:
        raise AssertionError("sending never accepts events")

    async def no_wait(event_id: str, timeout: float) -> WaitResult:
        raise AssertionError("sending never waits for replies")

    return ChannelContext(no_accept, no_wait, http)


def llm_settings(fake: FakeOpenAI, **extra: Any) -> dict[str, Any]:
    """Settings that point the OpenAI provider at the fake model server."""
    return dict(
        llm_provider="openai", llm_base_url=fake.url, llm_api_key="sk-test", llm_model="fake-model", **extra
    )


async def stored_answer(runtime: Any) -> str:
    """The newest assistant message stored."""
    async with runtime.engine.connect() as conn:
        rows = (await conn.execute(select(messages.c.role, messages.c.content).order_by(messages.c.id))).all()
    return [content for role, content in rows if role == "assistant"][-1]


# The fake file hosts run on 127.0.0.1: a URL from a payload reaches them only because the
# operator named the host (`MEDIA_ALLOW_PRIVATE_HOSTS`), as one would for a bridge on the LAN.
LOCAL_MEDIA: dict[str, Any] = {"media_allow_private_hosts": ["127.0.0.1"]}
