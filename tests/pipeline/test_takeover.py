"""A replica that died mid-run: its session is taken over once its lease expires."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import httpx

from app.db.models import session_keys, utcnow
from app.events import InboundEvent
from tests.conftest import ServeApp


async def test_expired_lease_of_a_dead_replica_is_taken_over_and_counted(serve: ServeApp) -> None:
    async with serve(lease_ttl_seconds=5) as srv, httpx.AsyncClient(timeout=30) as client:
        runtime = srv.runtime
        # A dead replica held the key and left an event unfinished.
        async with runtime.engine.begin() as conn:
            await runtime.inbox._insert(  # what the dead replica accepted before dying
                conn, InboundEvent.from_text("webhook", "c", "u", "left behind"), utcnow()
            )
            await conn.execute(
                session_keys.insert().values(
                    key="webhook:c",
                    lease_owner="dead-replica",
                    lease_fence=7,
                    lease_expires_at=utcnow() - timedelta(seconds=1),
                )
            )
        # The poller finds the key, takes the expired lease and answers.
        for _ in range(100):
            detail = await client.get(
                f"{srv.url}/admin/api/sessions/webhook%3Ac",
                headers={"Authorization": "Bearer test-admin-token"},
            )
            if detail.status_code == 200 and detail.json()["message_count"] == 2:
                break
            await asyncio.sleep(0.1)
        assert detail.json()["message_count"] == 2
        assert detail.json()["lease"]["fence"] == 8
        metrics = (await client.get(f"{srv.url}/metrics")).text
        assert "chatgate_lease_takeovers_total 1.0" in metrics
