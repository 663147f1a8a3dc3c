"""No pooled connection is held while the model thinks."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from app.api.app import create_app
from tests.conftest import WEBHOOK_SECRET, make_settings, webhook_settings
from tests.support.providers import RecordingProvider
from tests.support.servers import serve_in_loop
from tests.support.webhook import post_webhook


@pytest.mark.parametrize("sessions", [10])
async def test_more_runs_overlap_than_the_pool_has_connections(pg_url: str, sessions: int) -> None:
    # db_pool_size=1 → one connection in this process.
    settings = make_settings(pg_url, db_pool_size=1, max_concurrent_runs=sessions)
    provider = RecordingProvider(delay=0.5)
    app = create_app(settings, channel_settings={"webhook": webhook_settings()}, provider=provider)
    async with serve_in_loop(app) as srv, httpx.AsyncClient(timeout=60) as client:
        replies = await asyncio.gather(
            *(
                post_webhook(
                    client,
                    srv.url,
                    WEBHOOK_SECRET,
                    {"chat_id": f"c{i}", "sender_id": "u", "text": "hi"},
                    wait=True,
                )
                for i in range(sessions)
            )
        )
    assert all(r.status_code == 200 and r.json()["replies"] for r in replies)
    assert provider.max_active > 2, (
        f"only {provider.max_active} model calls overlapped with a 1-connection pool"
    )
