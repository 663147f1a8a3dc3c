"""Helpers of the personal WeChat (iLink) tests: settings pointing at the fake."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.db.models import connection_leases
from channels.weixin import WeixinSettings
from tests.fakes.weixin import FakeILink

WX_SETTINGS = WeixinSettings(_env_file=None, bot_token="t")  # type: ignore[call-arg]


def wx_settings(fake: FakeILink, **overrides: Any) -> WeixinSettings:
    values: dict[str, Any] = dict(
        bot_token=fake.token,
        api_base_url=fake.url,
        cdn_base_url=fake.cdn_url,
        poll_retry_seconds=0.1,
        expired_check_seconds=0.2,
    )
    values.update(overrides)
    return WeixinSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def saved_cursor(engine: Any, name: str = "weixin:default") -> str | None:
    """The cursor the connection's holder saved in its lease row."""
    async with engine.connect() as conn:
        state = (
            await conn.execute(select(connection_leases.c.state).where(connection_leases.c.name == name))
        ).scalar()
    return state.get("cursor") if isinstance(state, dict) else None
