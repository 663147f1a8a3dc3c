"""LINE webhook end to end: the official SDK (`linebot.v3`) against a fake Messaging API.

Signatures are computed here from the published rule (base64 HMAC-SHA256 of the raw body
with the channel secret), never by the adapter's code. Every test runs on both stores.
"""

from __future__ import annotations

import base64
import time
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import inbox, messages
from channels.line import LineSettings
from tests.channels.support import count, inbox_keys, session_messages, settled_outbox
from tests.conftest import ServeApp
from tests.fakes.line import (
    ACCESS_TOKEN,
    SECRET,
    FakeLine,
    image_message,
    message_event,
    signed_headers,
    text_message,
    webhook_body,
)
from tests.support.providers import RecordingProvider

USER = "U4af4980629a0b1c2d3e4f5a6b7c8d9e0"
GROUP = "Ca56f94637c0b1c2d3e4f5a6b7c8d9e01"
ROOM = "Rb56f94637c0b1c2d3e4f5a6b7c8d9e02"
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def line_settings(fake: FakeLine, **overrides: Any) -> LineSettings:
    values: dict[str, Any] = {
        "channel_secret": SECRET,
        "channel_access_token": ACCESS_TOKEN,
        "api_base_url": fake.url,
        "data_api_base_url": fake.data_url,
    }
    values.update(overrides)
    return LineSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def _post(
    client: httpx.AsyncClient, srv: Any, *events: dict[str, Any], secret: str = SECRET
) -> httpx.Response:
    body = webhook_body(*events)
    return await client.post(f"{srv.url}/channels/line", content=body, headers=signed_headers(secret, body))


async def _user_texts(client: httpx.AsyncClient, srv: Any, key: str) -> list[str]:
    return [m["content"] for m in await session_messages(client, srv.url, key) if m["role"] == "user"]


async def test_a_user_message_is_answered_with_its_reply_token(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            token = fake.reply_token()
            message = text_message("hello")
            event = message_event(message, user=USER, reply_token=token, event_id="01HWEBHOOKEVENT0001")
            resp = await _post(client, srv, event)
            assert resp.status_code == 200, resp.text
            [sent] = await fake.wait_for(1)
            assert sent.path == "/v2/bot/message/reply"
            assert sent.body["replyToken"] == token
            assert sent.body["messages"] == [
                {"type": "text", "text": "You said: hello", "quoteToken": message["quoteToken"]}
            ]
            assert await _user_texts(client, srv, f"line:{USER}") == ["hello"]
            async with srv.runtime.engine.connect() as conn:
                [external] = (await conn.execute(select(inbox.c.external_id))).scalars().all()
            assert external == "event:01HWEBHOOKEVENT0001"
            assert fake.refused == []


async def test_an_expired_reply_token_is_not_used_and_the_answer_is_pushed(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            old = int((time.time() - 120) * 1000)  # the event happened two minutes ago
            event = message_event(
                text_message("late"), user=USER, reply_token=fake.reply_token(age=120), timestamp_ms=old
            )
            assert (await _post(client, srv, event)).status_code == 200
            [sent] = await fake.wait_for(1)
            assert sent.path == "/v2/bot/message/push"
            assert sent.body["to"] == USER
            assert [m["text"] for m in sent.body["messages"]] == ["You said: late"]
            assert sent.retry_key  # a push always carries a retry key
            assert fake.refused == []  # the stale token was never tried


async def test_a_reply_token_line_refuses_falls_back_to_a_push(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Recent by the event's timestamp, but LINE no longer honours it (used elsewhere).
            event = message_event(text_message("hi"), user=USER, reply_token="not-a-token-line-knows")
            assert (await _post(client, srv, event)).status_code == 200
            [sent] = await fake.wait_for(1)
            assert sent.path == "/v2/bot/message/push"
            assert fake.refused == [("/v2/bot/message/reply", 400)]
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "sent"


async def test_a_redelivered_event_is_stored_and_answered_once(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            message = text_message("once")
            first = message_event(
                message, user=USER, reply_token=fake.reply_token(), event_id="01HREDELIVERED"
            )
            assert (await _post(client, srv, first)).status_code == 200
            await fake.wait_for(1)
            await settled_outbox(srv.runtime)
            again = {**first, "deliveryContext": {"isRedelivery": True}}
            assert (await _post(client, srv, again)).status_code == 200
            assert await count(srv.runtime, inbox) == 1
            await settled_outbox(srv.runtime)
            assert len(fake.sent) == 1
            assert await _user_texts(client, srv, f"line:{USER}") == ["once"]


async def test_a_bad_signature_is_401_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = message_event(text_message("forged"), user=USER, reply_token=fake.reply_token())
            wrong = await _post(client, srv, event, secret="not-the-channel-secret")
            assert wrong.status_code == 401, wrong.text
            body = webhook_body(event)
            unsigned = await client.post(
                f"{srv.url}/channels/line", content=body, headers={"Content-Type": "application/json"}
            )
            assert unsigned.status_code == 401
            # The signature is over the exact bytes: a re-serialised body does not match.
            tampered = await client.post(
                f"{srv.url}/channels/line",
                content=body.replace(b"forged", b"FORGED"),
                headers=signed_headers(SECRET, body),
            )
            assert tampered.status_code == 401
            assert await count(srv.runtime, inbox) == 0
            assert fake.sent == [] and fake.refused == []


async def test_the_console_verify_request_is_answered(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await _post(client, srv)  # {"destination": …, "events": []}
            assert resp.status_code == 200
            assert await count(srv.runtime, inbox) == 0


async def test_group_and_room_messages_are_keyed_to_the_group_or_room(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            in_group = message_event(
                text_message("tea", mention_bot=True), user=USER, group=GROUP, reply_token=fake.reply_token()
            )
            in_room = message_event(
                text_message("coffee", mention_bot=True), user=USER, room=ROOM, reply_token=fake.reply_token()
            )
            not_for_the_bot = message_event(
                text_message("chatting among ourselves"),
                user=USER,
                group=GROUP,
                reply_token=fake.reply_token(),
            )
            assert (await _post(client, srv, not_for_the_bot)).status_code == 200
            assert (await _post(client, srv, in_group)).status_code == 200
            assert (await _post(client, srv, in_room)).status_code == 200
            sent = await fake.wait_for(2)
            assert {s.path for s in sent} == {"/v2/bot/message/reply"}
            assert await _user_texts(client, srv, f"line:{GROUP}") == ["@gate tea"]
            assert await _user_texts(client, srv, f"line:{ROOM}") == ["@gate coffee"]
            assert sorted(await inbox_keys(srv.runtime)) == sorted([f"line:{GROUP}", f"line:{ROOM}"])
            # No loading animation in groups: LINE shows it in one-to-one chats only.
            assert fake.loading == []


async def test_an_image_is_downloaded_from_the_content_api(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.contents["477000000001"] = PIXEL
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = message_event(image_message("477000000001"), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, event)).status_code == 200
            await fake.wait_for(1)
            assert fake.content_requests == ["477000000001"]
            async with srv.runtime.engine.connect() as conn:
                [parts] = (
                    await conn.execute(select(messages.c.parts).where(messages.c.role == "user"))
                ).scalars()
    images = [p for p in parts if p.get("type") == "image"]
    assert [p["data_base64"] for p in images] == [base64.b64encode(PIXEL).decode()]


async def test_an_image_over_the_cap_gets_a_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.contents["477000000002"] = b"x" * 5000
        settings = line_settings(fake, media_max_bytes=1000)
        async with serve(channel_settings={"line": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            event = message_event(image_message("477000000002"), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, event)).status_code == 200
            [sent] = await fake.wait_for(1)
            assert "too large" in sent.body["messages"][0]["text"]
            assert await count(srv.runtime, inbox) == 0


async def test_a_long_answer_is_split_five_messages_per_request(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        settings = line_settings(fake, max_text_chars=20)
        async with serve(channel_settings={"line": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            words = " ".join(f"word{i:02d}" for i in range(20))  # ~140 characters: 8 messages of ≤ 20
            event = message_event(text_message(words), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, event)).status_code == 200
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "sent"
    first, second = fake.sent
    assert first.path == "/v2/bot/message/reply" and len(first.body["messages"]) == 5
    assert second.path == "/v2/bot/message/push" and second.body["to"] == USER
    assert all(len(t) <= 20 for t in fake.texts())
    assert " ".join(t.strip() for t in fake.texts()) == f"You said: {words}"


async def test_a_push_that_fails_is_retried_by_the_outbox_and_delivered_once(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.fail_next["/v2/bot/message/push"] = [500, 429]
        old = int((time.time() - 300) * 1000)
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = message_event(text_message("retry"), user=USER, reply_token="gone", timestamp_ms=old)
            assert (await _post(client, srv, event)).status_code == 200
            [sent] = await fake.wait_for(1, timeout=60)
            [row] = await settled_outbox(srv.runtime, timeout=60)
    assert row.status == "sent"
    assert fake.refused == [("/v2/bot/message/push", 500), ("/v2/bot/message/push", 429)]
    assert [m["text"] for m in sent.body["messages"]] == ["You said: retry"]


async def test_the_loading_animation_shows_in_a_one_to_one_chat(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        # The answer waits for the animation: a turn quicker than the animation's start
        # shows none, which is right, and not what this test looks at.
        model = RecordingProvider(hold=fake.loaded)
        async with (
            serve(channel_settings={"line": line_settings(fake)}, provider=model) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = message_event(text_message("think"), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, event)).status_code == 200
            [shown] = await fake.wait_for_loading(1)
            assert shown == {"chatId": USER, "loadingSeconds": 20}
            await fake.wait_for(1)


async def test_a_body_with_one_bad_event_is_400_and_stores_nothing(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            good = message_event(text_message("fine"), user=USER, reply_token=fake.reply_token())
            bad = message_event(text_message("broken"), user=USER, reply_token=fake.reply_token())
            bad["source"] = {"type": "satellite", "userId": USER}
            resp = await _post(client, srv, good, bad)
            assert resp.status_code == 400, resp.text
            assert await count(srv.runtime, inbox) == 0
            assert fake.sent == []


async def test_a_retry_after_a_partial_send_sends_only_the_rest(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.fail_next["/v2/bot/message/push"] = [503]
        settings = line_settings(fake, max_text_chars=20)
        async with serve(channel_settings={"line": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            words = " ".join(f"word{i:02d}" for i in range(20))
            event = message_event(text_message(words), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, event)).status_code == 200
            [row] = await settled_outbox(srv.runtime, timeout=60)
            assert row.status == "sent"
    # The reply (first five messages) went once; only the failed push was sent again.
    assert [s.path for s in fake.sent] == ["/v2/bot/message/reply", "/v2/bot/message/push"]
    assert fake.refused == [("/v2/bot/message/push", 503)]
    assert " ".join(t.strip() for t in fake.texts()) == f"You said: {words}"


async def test_a_used_up_monthly_quota_fails_the_push_without_retrying(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.fail_next["/v2/bot/message/push"] = [(429, "You have reached your monthly limit.")]
        old = int((time.time() - 300) * 1000)
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = message_event(text_message("quota"), user=USER, reply_token="gone", timestamp_ms=old)
            assert (await _post(client, srv, event)).status_code == 200
            [row] = await settled_outbox(srv.runtime, timeout=60)
    assert row.status == "failed"
    assert "monthly limit" in row.last_error
    assert fake.refused == [("/v2/bot/message/push", 429)] and fake.sent == []


async def test_quoting_the_bots_message_in_a_group_addresses_it(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            asked = message_event(
                text_message("tea?", mention_bot=True), user=USER, group=GROUP, reply_token=fake.reply_token()
            )
            assert (await _post(client, srv, asked)).status_code == 200
            [answer] = await fake.wait_for(1)
            await settled_outbox(srv.runtime)
            # Quoting someone else's message is not for the bot; quoting the bot's answer is.
            other = text_message("sure") | {"quotedMessageId": "1234567890"}
            quoting = text_message("and coffee?") | {"quotedMessageId": answer.ids[0]}
            for message in (other, quoting):
                event = message_event(message, user=USER, group=GROUP, reply_token=fake.reply_token())
                assert (await _post(client, srv, event)).status_code == 200
            second = (await fake.wait_for(2))[1]
            assert [m["text"] for m in second.body["messages"]] == ["You said: and coffee?"]
            assert await _user_texts(client, srv, f"line:{GROUP}") == ["@gate tea?", "and coffee?"]


async def test_a_reply_that_fails_is_retried_with_the_same_token_while_it_is_fresh(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.fail_next["/v2/bot/message/reply"] = [500]
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            token = fake.reply_token()
            event = message_event(text_message("again"), user=USER, reply_token=token)
            assert (await _post(client, srv, event)).status_code == 200
            [row] = await settled_outbox(srv.runtime, timeout=60)
    assert row.status == "sent"
    assert fake.refused == [("/v2/bot/message/reply", 500)]
    [sent] = fake.sent
    assert sent.path == "/v2/bot/message/reply" and sent.body["replyToken"] == token
