"""Shared helpers of the Slack tests: settings pointing at the fake, posting events, DB reads."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from sqlalchemy import func, select

from app.db.models import inbox, outbox
from channels.slack import SlackSettings
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack


def slack_settings(fake: FakeSlack, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = dict(
        bot_token=fake.token,
        signing_secret=sl.SIGNING_SECRET,
        api_base_url=fake.url,
    )
    values.update(overrides)
    return SlackSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_event(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """POST an Events API payload, signed with Slack's rule."""
    body = json.dumps(payload).encode()
    return await client.post(
        f"{base_url}/channels/slack/events",
        content=body,
        headers={**sl.signed_headers(body), **(headers or {})},
    )


async def count(runtime: Any, table: Any) -> int:
    async with runtime.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


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
    deadline = loop.time() + timeout
    while True:
        rows = await outbox_rows(runtime)
        final = [r for r in rows if r["status"] in ("sent", "failed")]
        if len(final) >= count:
            return rows
        if loop.time() > deadline:
            raise AssertionError(f"outbox not final in {timeout}s: {rows}")
        await asyncio.sleep(0.05)


async def wait_inbox_done(runtime: Any, timeout: float = 15) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        async with runtime.engine.connect() as conn:
            open_rows = (
                await conn.execute(
                    select(func.count())
                    .select_from(inbox)
                    .where(inbox.c.status.in_(("pending", "processing")))
                )
            ).scalar_one()
        if open_rows == 0:
            return
        if loop.time() > deadline:
            raise AssertionError("inbox not drained")
        await asyncio.sleep(0.05)
