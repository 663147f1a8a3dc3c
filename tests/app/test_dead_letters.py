"""Dead letters: failed events and deliveries listed, retried exactly once more, or discarded —
through the admin API, the CLI and `/metrics`, on both backends."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from sqlalchemy import select

from app.agent.provider import ProviderReply, ToolSpec
from app.db.models import inbox, outbox
from app.events import InboundEvent
from app.sessions.messages import ChatMessage
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.servers import ROOT
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
API = "/admin/api/dead-letters"


@dataclass
class BrokenWhile:
    """A model that fails on the texts in `broken` and echoes everything else."""

    broken: set[str]
    name: str = "broken"
    calls: list[str] = field(default_factory=list)

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        user = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        self.calls.append(user)
        if user in self.broken:
            raise RuntimeError(f"model broke on {user!r}")
        return ProviderReply(content=f"echo {user}")

    async def aclose(self) -> None:
        return None


async def _status(runtime: Any, table: Any, column: Any, value: Any) -> str:
    async with runtime.engine.connect() as conn:
        return str((await conn.execute(select(table.c.status).where(column == value))).scalar_one())


async def _until(check: Any, timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


async def _fail_events(runtime: Any, *texts: str, chat: str = "c") -> list[str]:
    events = [InboundEvent.from_text("webhook", chat, "u", t) for t in texts]
    for event in events:
        await runtime.ingest.submit([event])
    for event in events:
        assert (await runtime.waiters.wait_for_replies(event.event_id, 30)).done
    return [e.event_id for e in events]


async def test_a_failed_event_is_listed_then_retried_exactly_once(serve: ServeApp) -> None:
    model = BrokenWhile({"boom"})
    async with (
        serve(provider=model, max_event_attempts=2) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url) as http,
    ):
        [boom] = await _fail_events(srv.runtime, "boom")
        assert model.calls.count("boom") == 2

        listed = (await http.get(API, headers=AUTH)).json()
        assert listed["counts"] == {"inbox": 1, "outbox": 0}
        [letter] = listed["dead_letters"]
        assert letter["kind"] == "inbox" and letter["event_id"] == boom
        assert letter["session_key"] == "webhook:c" and "model broke" in letter["error"]
        assert letter["text"] == "boom" and letter["failed_at"]
        metrics = (await http.get("/metrics")).text
        assert 'chatgate_dead_letters{kind="inbox"} 1.0' in metrics

        model.broken.clear()  # the operator fixed the cause
        first, second = await asyncio.gather(
            http.post(f"{API}/{letter['id']}/retry", headers=AUTH),
            http.post(f"{API}/{letter['id']}/retry", headers=AUTH),
        )
        assert sorted([first.status_code, second.status_code]) == [200, 404]  # re-queued once
        await _until(lambda: _done(srv.runtime, boom))
        assert model.calls.count("boom") == 3  # exactly one more attempt
        replies = await srv.runtime.waiters.wait_for_replies(boom, 5)
        assert "echo boom" in [r.text for r in replies.replies]
        after = (await http.get(API, headers=AUTH)).json()
        assert after == {"dead_letters": [], "counts": {"inbox": 0, "outbox": 0}}
        assert 'chatgate_dead_letters{kind="inbox"} 0.0' in (await http.get("/metrics")).text


async def _done(runtime: Any, event_id: str) -> bool:
    return await _status(runtime, inbox, inbox.c.event_id, event_id) == "done"


async def test_a_retry_that_fails_again_is_a_dead_letter_again(serve: ServeApp) -> None:
    model = BrokenWhile({"boom"})
    async with (
        serve(provider=model, max_event_attempts=3) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url) as http,
    ):
        [boom] = await _fail_events(srv.runtime, "boom")
        resp = await http.post(API + "/retry", json={"session_key": "webhook:c"}, headers=AUTH)
        assert len(resp.json()["retried"]) == 1

        async def failed_again() -> bool:
            return await _status(srv.runtime, inbox, inbox.c.event_id, boom) == "failed"

        async def ran_again() -> bool:
            return model.calls.count("boom") >= 4

        await _until(ran_again)
        await _until(failed_again)
        # A later event of the same conversation is the barrier: a further attempt of the
        # failed one would come before it.
        await _fail_events(srv.runtime, "after", chat="c")
        assert model.calls.count("boom") == 4  # three attempts, then one more, not three more


async def test_a_failed_delivery_is_retried_once_through_the_sender(serve: ServeApp) -> None:
    async with HttpReceiver(fail_first=2) as receiver:
        channel = {"webhook": webhook_settings(callback_url=receiver.url)}
        async with (
            serve(channel_settings=channel, outbox_max_attempts=2) as srv,
            httpx.AsyncClient(timeout=30, base_url=srv.url) as http,
        ):
            sent = await post_webhook(
                http, srv.url, WEBHOOK_SECRET, {"chat_id": "d", "sender_id": "u", "text": "hi"}
            )
            event_id = sent.json()["event_id"]

            async def failed() -> bool:
                async with srv.runtime.engine.connect() as conn:
                    rows = await conn.execute(select(outbox.c.status).where(outbox.c.event_id == event_id))
                    return [r[0] for r in rows] == ["failed"]

            await _until(failed)
            [letter] = (await http.get(API + "?kind=outbox", headers=AUTH)).json()["dead_letters"]
            assert letter["event_id"] == event_id and letter["error"] and letter["attempts"] == 2
            assert letter["text"] == "You said: hi"
            retried = await http.post(f"{API}/{letter['id']}/retry", headers=AUTH)
            assert retried.json() == {"retried": [letter["id"]]}
            [received] = await receiver.wait_for(1)
            assert json.loads(received.body)["event_id"] == event_id
            assert receiver.attempts == 3  # two failures, then the one retry
            again = await http.post(f"{API}/{letter['id']}/retry", headers=AUTH)
            assert again.status_code == 404


async def test_discard_by_filter_and_retention_keeps_unresolved_ones(serve: ServeApp) -> None:
    model = BrokenWhile({"a", "b", "c"})
    async with (
        serve(provider=model, max_event_attempts=1) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url) as http,
    ):
        a, b = await _fail_events(srv.runtime, "a", "b", chat="one")
        [c] = await _fail_events(srv.runtime, "c", chat="two")
        refused = await http.post(API + "/discard", json={}, headers=AUTH)
        assert refused.status_code == 400  # no selection never means "everything"
        bad = await http.post(API + "/discard", json={"ids": ["inbox:x"]}, headers=AUTH)
        assert bad.status_code == 400
        assert (await http.post(API + "/inbox:999999/discard", headers=AUTH)).status_code == 404

        gone = await http.post(
            API + "/discard",
            json={"channel": "webhook", "session_key": "webhook:one"},
            headers=AUTH,
        )
        assert len(gone.json()["discarded"]) == 2
        assert await _status(srv.runtime, inbox, inbox.c.event_id, a) == "discarded"
        assert await _status(srv.runtime, inbox, inbox.c.event_id, b) == "discarded"
        [left] = (await http.get(API, headers=AUTH)).json()["dead_letters"]
        assert left["event_id"] == c
        # A later event of the same conversation is the barrier: a discarded one run again
        # would run before it.
        [barrier] = await _fail_events(srv.runtime, "later", chat="one")
        assert model.calls.count("a") == 1  # a discarded event is never run again
        assert await _status(srv.runtime, inbox, inbox.c.event_id, a) == "discarded"

        from datetime import timedelta

        from app.db.models import utcnow
        from app.pipeline import retention

        await retention.prune(
            srv.runtime.engine, inbox_days=1, outbox_days=1, now=utcnow() + timedelta(days=30)
        )
        async with srv.runtime.engine.connect() as conn:
            kept = set((await conn.execute(select(inbox.c.event_id))).scalars())
        assert kept == {c}  # the unresolved dead letter stays; discarded and done ones go
        assert barrier not in kept
        assert (await http.get(API, headers={"Authorization": "Bearer wrong"})).status_code == 401


async def test_cli_lists_retries_and_discards(serve: ServeApp, db_url: str) -> None:
    model = BrokenWhile({"x", "y"})
    async with serve(provider=model, max_event_attempts=1) as srv:
        x, y = await _fail_events(srv.runtime, "x", "y")
        env = {**os.environ, "DATABASE_URL": db_url, "MAX_EVENT_ATTEMPTS": "1", "LOG_LEVEL": "WARNING"}

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "app", "dead-letters", *args],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )

        listed = await asyncio.to_thread(cli, "list", "--kind", "inbox")
        assert listed.returncode == 0, listed.stderr
        letters = {d["event_id"]: d["id"] for d in json.loads(listed.stdout)["dead_letters"]}
        assert set(letters) == {x, y}
        assert (await asyncio.to_thread(cli, "retry")).returncode == 2  # nothing selected
        model.broken.clear()
        retried = await asyncio.to_thread(cli, "retry", letters[x])
        assert json.loads(retried.stdout) == {"retried": [letters[x]]}
        discarded = await asyncio.to_thread(cli, "discard", "--error", "model broke", "--all")
        assert json.loads(discarded.stdout) == {"discarded": [letters[y]]}
        await _until(lambda: _done(srv.runtime, x))
        again = await asyncio.to_thread(cli, "retry", letters[y])
        assert again.returncode == 1 and "not dead letters" in again.stderr
