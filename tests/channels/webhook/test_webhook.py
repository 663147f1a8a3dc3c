"""The generic signed webhook, end to end through a real server on both backends."""

from __future__ import annotations

import json
import time

import httpx
from sqlalchemy import func, select

from app.db.models import inbox, messages, outbox
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.webhook import post_webhook, signed_headers


async def _count(runtime, table) -> int:
    async with runtime.engine.connect() as conn:
        return (await conn.execute(select(func.count()).select_from(table))).scalar_one()


async def test_wait_mode_returns_the_reply_and_history_has_the_tool_call(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        resp = await post_webhook(
            client,
            srv.url,
            WEBHOOK_SECRET,
            {"chat_id": "c1", "sender_id": "u1", "text": "what time is it?"},
            wait=True,
        )
        assert resp.status_code == 200, resp.text
        body = resp.json()
        assert body["session_key"] == "webhook:c1"
        assert len(body["replies"]) == 1
        assert body["replies"][0]["text"].startswith("It is ")

        hist = await client.get(
            f"{srv.url}/admin/api/sessions/webhook%3Ac1/messages",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        assert hist.status_code == 200
        roles = [(m["role"], bool(m["tool_calls"])) for m in hist.json()["messages"]]
        assert roles == [("user", False), ("assistant", True), ("tool", False), ("assistant", False)]
        call_id = hist.json()["messages"][1]["tool_calls"][0]["id"]
        assert hist.json()["messages"][2]["tool_call_id"] == call_id


async def test_without_wait_answers_202_after_commit(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        resp = await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "hi"}
        )
        assert resp.status_code == 202
        event_id = resp.json()["event_id"]
        async with srv.runtime.engine.connect() as conn:
            row = (await conn.execute(select(inbox.c.event_id).where(inbox.c.event_id == event_id))).first()
        assert row is not None  # committed before the answer


async def test_same_webhook_three_times_is_one_event_and_one_reply(serve: ServeApp) -> None:
    payload = {"chat_id": "c", "sender_id": "u", "text": "hello", "message_id": "m-1"}
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        first = await post_webhook(client, srv.url, WEBHOOK_SECRET, payload, wait=True)
        again = [await post_webhook(client, srv.url, WEBHOOK_SECRET, payload, wait=True) for _ in range(2)]
        assert first.status_code == 200
        for resp in again:
            assert resp.status_code == 200
            assert resp.json()["duplicate"] is True
            assert resp.json()["event_id"] == first.json()["event_id"]
            assert [r["message_id"] for r in resp.json()["replies"]] == [
                r["message_id"] for r in first.json()["replies"]
            ]
        assert await _count(srv.runtime, inbox) == 1
        assert await _count(srv.runtime, outbox) == 1
        assert await _count(srv.runtime, messages) == 2


async def test_idempotency_key_header_deduplicates(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        codes = []
        for text in ("a", "b"):  # same key, different bodies: the key wins
            resp = await post_webhook(
                client,
                srv.url,
                WEBHOOK_SECRET,
                {"chat_id": "c", "sender_id": "u", "text": text},
                headers={"Idempotency-Key": "k-1"},
            )
            codes.append(resp.status_code)
        assert codes == [202, 200]
        assert await _count(srv.runtime, inbox) == 1


async def test_bad_input_gets_a_clear_4xx_and_stores_nothing(serve: ServeApp) -> None:
    good = json.dumps({"chat_id": "c", "sender_id": "u", "text": "hi"}).encode()
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        url = f"{srv.url}/channels/webhook"
        cases = []
        bad_sig = {**signed_headers(WEBHOOK_SECRET, good), "X-Chatgate-Signature": "sha256=" + "0" * 64}
        cases.append(("bad signature", good, bad_sig, 401))
        cases.append(("wrong secret", good, signed_headers("other-secret", good), 401))
        cases.append(("no signature", good, {"Content-Type": "application/json"}, 401))
        stale = signed_headers(WEBHOOK_SECRET, good, timestamp=int(time.time()) - 301)
        cases.append(("stale timestamp", good, stale, 401))
        future = signed_headers(WEBHOOK_SECRET, good, timestamp=int(time.time()) + 400)
        cases.append(("future timestamp", good, future, 401))
        malformed = b'{"chat_id": "c", '
        cases.append(("malformed JSON", malformed, signed_headers(WEBHOOK_SECRET, malformed), 400))
        not_object = b"[1, 2]"
        cases.append(("not an object", not_object, signed_headers(WEBHOOK_SECRET, not_object), 400))
        missing = json.dumps({"chat_id": "c", "text": "hi"}).encode()
        cases.append(("missing sender", missing, signed_headers(WEBHOOK_SECRET, missing), 400))
        huge = json.dumps({"chat_id": "c", "sender_id": "u", "text": "x" * (1024 * 1024)}).encode()
        cases.append(("oversized body", huge, signed_headers(WEBHOOK_SECRET, huge), 413))
        form = {**signed_headers(WEBHOOK_SECRET, good), "Content-Type": "application/x-www-form-urlencoded"}
        cases.append(("wrong content type", good, form, 415))
        for reason, body, headers, status in cases:
            resp = await client.post(url, content=body, headers=headers)
            assert resp.status_code == status, (reason, resp.status_code, resp.text)
            assert resp.json()["detail"], reason  # a reason the caller can read
        assert await _count(srv.runtime, inbox) == 0
        # ... and the service keeps serving.
        ok = await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "hi"}
        )
        assert ok.status_code == 202
        unknown = await client.post(
            f"{srv.url}/channels/nope", content=good, headers=signed_headers(WEBHOOK_SECRET, good)
        )
        assert unknown.status_code == 404


async def test_callback_delivery_retries_until_the_receiver_accepts(serve: ServeApp) -> None:
    from tests.fakes.http_receiver import HttpReceiver

    async with HttpReceiver(fail_first=2) as receiver:
        settings = webhook_settings(callback_url=receiver.url)
        async with (
            serve(channel_settings={"webhook": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "ping"}
            )
            assert resp.status_code == 202
            delivered = await receiver.wait_for(1, timeout=20)
    assert receiver.attempts == 3
    body = json.loads(delivered[0].body)
    assert body["text"] == "You said: ping"
    assert body["event_id"] == resp.json()["event_id"]
    # The receiver can check our signature with the published rule.
    req = delivered[0]
    expected = signed_headers(WEBHOOK_SECRET, req.body, timestamp=int(req.headers["x-chatgate-timestamp"]))
    assert req.headers["x-chatgate-signature"] == expected["X-Chatgate-Signature"]


async def test_without_a_callback_replies_are_stored_as_sent_and_never_claimed(serve: ServeApp) -> None:
    """Nothing to deliver: the reply row is written as sent, the outbox sender leaves it be."""
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        for text in ("hello", "/new", "what time is it?"):  # an answer, a command, a tool turn
            resp = await post_webhook(
                client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": text}, wait=True
            )
            assert resp.status_code == 200, resp.text
            assert [r["status"] for r in resp.json()["replies"]] == ["sent"]
        await srv.runtime.sender.deliver_due()  # a claim now would find them if they were due
        async with srv.runtime.engine.connect() as conn:
            rows = (await conn.execute(select(outbox.c.status, outbox.c.attempts, outbox.c.sent_at))).all()
    assert len(rows) == 3
    # A claim counts an attempt: none was made.
    assert all(status == "sent" and attempts == 0 and sent is not None for status, attempts, sent in rows)
