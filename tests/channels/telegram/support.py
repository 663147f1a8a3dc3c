"""Shared helpers of the Telegram tests: settings pointing at the fake, posting updates, DB reads."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from sqlalchemy import func, select

from app.db.models import inbox, outbox
from channels.telegram import TelegramSettings
from tests.fakes.telegram import FakeTelegram

SECRET = "tg-secret_123"


def tg_settings(fake: FakeTelegram, **overrides: Any) -> TelegramSettings:
    values: dict[str, Any] = dict(
        bot_token=fake.token,
        webhook_secret=SECRET,
        api_base_url=fake.url,
        file_base_url=fake.file_url,
    )
    values.update(overrides)
    return TelegramSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_update(
    client: httpx.AsyncClient, base_url: str, update: dict[str, Any], *, secret: str | None = SECRET
) -> httpx.Response:
    """POST an update the way Telegram does: JSON body, the secret token header (unsigned body)."""
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers["X-Telegram-Bot-Api-Secret-Token"] = secret
    return await client.post(f"{base_url}/channels/telegram", content=json.dumps(update), headers=headers)


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
