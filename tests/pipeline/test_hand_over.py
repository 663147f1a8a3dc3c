"""The hand-over of a stopping runtime (`app.shutdown`), in one process, on every store:
a turn that finishes within the grace is answered and its lease given up; one that
outlasts it is cancelled with its lease given up too, never left to expire."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import select

from app.db.models import inbox, outbox, session_keys
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import WEBHOOK_SECRET, ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.webhook import post_webhook


async def _lease_owner(runtime: object, key: str) -> str | None:
    async with runtime.engine.connect() as conn:  # type: ignore[attr-defined]
        row = (
            await conn.execute(select(session_keys.c.lease_owner).where(session_keys.c.key == key))
        ).first()
    return None if row is None else row[0]


async def test_a_turn_within_the_grace_is_answered_and_one_past_it_handed_on(serve: ServeApp) -> None:
    quick, slow = asyncio.Event(), asyncio.Event()
    async with FakeOpenAI() as fake:
        fake.enqueue(Reply(content="quick answer", hold=quick), Reply(content="slow answer", hold=slow))
        async with (
            serve(**openai_settings(fake), lease_ttl_seconds=60) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            runtime = srv.runtime
            for chat in ("quick", "slow"):
                resp = await post_webhook(
                    client, srv.url, WEBHOOK_SECRET, {"chat_id": chat, "sender_id": "u", "text": chat}
                )
                assert resp.status_code == 202
                await fake.wait_requests(1 if chat == "quick" else 2)
            hand_over = asyncio.create_task(runtime.handover.run(grace=1.5))
            await asyncio.sleep(0.2)
            ready = await client.get(f"{srv.url}/readyz")
            refused = await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": "late", "sender_id": "u", "text": "x"}
            )
            quick.set()  # within the grace; the slow one never answers in time
            done = await hand_over
            owners = {key: await _lease_owner(runtime, key) for key in ("webhook:quick", "webhook:slow")}
            async with runtime.engine.connect() as conn:
                rows = dict((await conn.execute(select(inbox.c.session_key, inbox.c.status))).all())
                replies = (await conn.execute(select(outbox.c.session_key))).scalars().all()
            slow.set()
    assert ready.status_code == 503 and ready.json()["status"] == "stopping"
    assert refused.status_code == 503 and refused.headers["Retry-After"].isdigit()
    assert done.cancelled_turns == 1
    assert owners == {"webhook:quick": None, "webhook:slow": None}  # both free for another replica
    assert rows["webhook:quick"] == "done" and replies == ["webhook:quick"]
    assert rows["webhook:slow"] in ("pending", "processing")  # run again by whoever takes the key
    assert "webhook:late" not in rows
