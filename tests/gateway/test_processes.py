"""Fan-out across two server processes on one PostgreSQL (LISTEN/NOTIFY, no broker)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET
from tests.gateway.conftest import ALICE_TOKEN, STATIC_TOKENS, gateway_client
from tests.support.servers import ServerProcess, stop_all

pytestmark = pytest.mark.slow


def _env(db_url: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "WEBHOOK_SECRET": WEBHOOK_SECRET,
        "ADMIN_TOKEN": ADMIN_TOKEN,
        "CHANNELS": "webhook,browser",
        "GATEWAY_TOKENS": json.dumps(STATIC_TOKENS),
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def test_connections_on_two_processes_share_one_session(pg_url: str) -> None:
    procs = [ServerProcess(_env(pg_url)), ServerProcess(_env(pg_url))]
    await asyncio.gather(*(asyncio.to_thread(p.start) for p in procs))
    try:
        one, two = procs
        async with gateway_client(one.url, ALICE_TOKEN) as tab1, gateway_client(two.url, ALICE_TOKEN) as tab2:
            await tab1.attach("web:alice")
            await tab2.attach("web:alice")
            # A message sent on process one: both tabs see the whole turn (which ever
            # process ran it).
            await tab1.send({"type": "send", "text": "what time is it", "client_message_id": "p1"})
            seen1 = await tab1.messages_until_answer()
            seen2 = await tab2.messages_until_answer()
            assert [m["seq"] for m in seen1] == [1, 2, 3, 4]
            assert seen1 == seen2
            # A long message sent on process two: over NOTIFY's payload limit, still whole.
            text = "long " * 4000
            await tab2.send({"type": "send", "text": text, "client_message_id": "p2"})
            got1 = await tab1.messages_until_answer()
            got2 = await tab2.messages_until_answer()
            assert [m["content"] for m in got1] == [text, f"You said: {text}"]
            assert got1 == got2

            # Tab one goes away; the session goes on through process two; tab one comes
            # back on process two and gets exactly what it missed.
            last = got1[-1]
        await_reply = {"session_id": last["session_id"], "last_seq": last["seq"]}
        async with gateway_client(two.url, ALICE_TOKEN) as tab2:
            await tab2.attach("web:alice")
            await tab2.send({"type": "send", "text": "third", "client_message_id": "p3"})
            await tab2.messages_until_answer()
        async with gateway_client(one.url, ALICE_TOKEN) as tab1:
            ready = await tab1.attach("web:alice", **await_reply)
            assert [(m["seq"], m["content"]) for m in ready["messages"]] == [
                (7, "third"),
                (8, "You said: third"),
            ]

        async with httpx.AsyncClient(timeout=30) as http:
            metrics = (await http.get(f"{one.url}/metrics")).text
        assert 'chatgate_events_accepted_total{channel="browser"}' in metrics
    finally:
        await stop_all(*procs)
