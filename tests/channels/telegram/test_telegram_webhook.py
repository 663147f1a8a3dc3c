"""Telegram webhook end to end: the real app, the real PTB Bot, a fake Bot API server."""

from __future__ import annotations

import asyncio

import httpx
from sqlalchemy import select

from app.db.models import inbox, outbox
from tests.channels.support import count, inbox_keys, wait_inbox_done, wait_outbox_final
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram


async def test_private_message_reaches_its_session_and_the_reply_reaches_telegram(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_update(client, srv.url, tg.update(1, tg.message("hello bot")))
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == "telegram:4242"
            [call] = await fake.wait_for("sendMessage", 1)
            assert await inbox_keys(srv.runtime) == ["telegram:4242"]
            [row] = await wait_outbox_final(srv.runtime)
    assert fake.calls_of("getMe"), "the bot learns its identity at start"
    assert call.params["chat_id"] == "4242"
    assert call.params["text"] == "You said: hello bot"
    assert "message_thread_id" not in call.params
    assert "reply_parameters" not in call.params  # private chats are not quoted
    assert row["status"] == "sent"
    assert row["platform_message_id"] is not None


async def test_forged_or_missing_secret_gets_401_and_stores_nothing(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            upd = tg.update(10, tg.message("let me in"))
            for secret in ("wrong-secret", "", None, "tg-secret_12"):
                resp = await post_update(client, srv.url, upd, secret=secret)
                assert resp.status_code == 401, (secret, resp.text)
                assert resp.json()["detail"]
            # Checked before parsing: even a malformed body is 401 without the secret.
            bad = await client.post(
                f"{srv.url}/channels/telegram",
                content=b"{not json",
                headers={"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": "x"},
            )
            assert bad.status_code == 401
            assert await count(srv.runtime, inbox) == 0
            # With the secret, malformed input is a 400 with a reason, and still nothing stored.
            for body in (
                b"{not json",
                b"[1]",
                b'{"update_id": "seven"}',
                b'{"update_id": 7, "message": "x"}',
            ):
                resp = await client.post(
                    f"{srv.url}/channels/telegram",
                    content=body,
                    headers={
                        "Content-Type": "application/json",
                        "X-Telegram-Bot-Api-Secret-Token": "tg-secret_123",
                    },
                )
                assert resp.status_code == 400, (body, resp.text)
            assert await count(srv.runtime, inbox) == 0
            # The server keeps serving.
            ok = await post_update(client, srv.url, upd)
            assert ok.status_code == 200
            await fake.wait_for("sendMessage", 1)
    assert fake.sent_texts() == ["You said: let me in"]


async def test_redelivered_update_is_processed_once(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            upd = tg.update(20, tg.message("once please"))
            first = await post_update(client, srv.url, upd)
            again = [await post_update(client, srv.url, upd) for _ in range(2)]
            assert first.status_code == 200
            for resp in again:
                assert resp.status_code == 200
                assert resp.json()["duplicate"] is True
                assert resp.json()["event_id"] == first.json()["event_id"]
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
    assert fake.sent_texts() == ["You said: once please"]


async def test_groups_answer_only_when_mentioned_or_replied_to(serve: ServeApp) -> None:
    group = tg.group_chat(-100777)
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            quiet = await post_update(client, srv.url, tg.update(40, tg.message("just chatting", chat=group)))
            assert quiet.status_code == 200
            assert "ignored" in quiet.json()
            other = "hey @someone_else look"
            await post_update(
                client,
                srv.url,
                tg.update(
                    41, tg.message(other, chat=group, entities=[tg.mention_entity(other, "@someone_else")])
                ),
            )
            await asyncio.sleep(0.3)
            assert await count(srv.runtime, inbox) == 0
            assert await count(srv.runtime, outbox) == 0

            text = "@gate_bot what is up"
            mentioned = tg.message(text, chat=group, entities=[tg.mention_entity(text)])
            resp = await post_update(client, srv.url, tg.update(42, mentioned))
            assert resp.json()["session_key"] == "telegram:-100777"
            await fake.wait_for("sendMessage", 1)
            bot_msg = tg.message("earlier answer", chat=group, sender=tg.bot_user())
            reply = tg.message("and then?", chat=group, reply_to_message=bot_msg)
            await post_update(client, srv.url, tg.update(43, reply))
            calls = await fake.wait_for("sendMessage", 2)
            await wait_outbox_final(srv.runtime, 2)
            assert await count(srv.runtime, inbox) == 2
    assert [c.params["text"] for c in calls] == ["You said: what is up", "You said: and then?"]
    assert all(c.params["chat_id"] == "-100777" for c in calls)
    # In groups the answer quotes the message it answers.
    assert calls[0].params["reply_parameters"]["message_id"] == mentioned["message_id"]
    assert calls[1].params["reply_parameters"]["message_id"] == reply["message_id"]


async def test_mention_gating_can_be_turned_off(serve: ServeApp) -> None:
    group = tg.group_chat(-100778)
    async with FakeTelegram() as fake:
        settings = tg_settings(fake, require_mention_in_groups=False, quote_in_groups=False)
        async with (
            serve(channel_settings={"telegram": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(50, tg.message("no mention", chat=group)))
            [call] = await fake.wait_for("sendMessage", 1)
    assert call.params["text"] == "You said: no mention"
    assert "reply_parameters" not in call.params


async def test_forum_topic_is_its_own_session_and_the_reply_goes_to_the_topic(serve: ServeApp) -> None:
    forum = tg.group_chat(-100999, forum=True)
    async with FakeTelegram() as fake:
        settings = tg_settings(fake, session_scope="thread")
        async with (
            serve(channel_settings={"telegram": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            keys = []
            for update_id, topic in ((60, 77), (61, 78)):
                text = f"@gate_bot topic {topic}"
                msg = tg.message(
                    text,
                    chat=forum,
                    entities=[tg.mention_entity(text)],
                    message_thread_id=topic,
                    is_topic_message=True,
                )
                resp = await post_update(client, srv.url, tg.update(update_id, msg))
                keys.append(resp.json()["session_key"])
            calls = await fake.wait_for("sendMessage", 2)
    assert keys == ["telegram:-100999:77", "telegram:-100999:78"]
    by_topic = {c.params["message_thread_id"]: c.params["text"] for c in calls}
    assert by_topic == {"77": "You said: topic 77", "78": "You said: topic 78"}


async def test_photo_and_document_become_parts(serve: ServeApp) -> None:
    photo = [
        {"file_id": "small-id", "file_unique_id": "s", "width": 90, "height": 90},
        {"file_id": "big-id", "file_unique_id": "b", "width": 1280, "height": 1280},
    ]
    doc = {"file_id": "doc-id", "file_unique_id": "d", "file_name": "a.pdf", "mime_type": "application/pdf"}
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.update(80, tg.message(None, photo=photo, caption="look")))
            await fake.wait_for("sendMessage", 1)
            await post_update(client, srv.url, tg.update(81, tg.message(None, document=doc)))
            await fake.wait_for("sendMessage", 2)
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                payloads = [r[0] for r in await conn.execute(select(inbox.c.payload).order_by(inbox.c.id))]
    first, second = (p["parts"] for p in payloads)
    assert first[0] == {"type": "text", "text": "look"}
    assert first[1]["type"] == "image" and first[1]["url"] == "telegram-file:big-id"
    # Stored without the fields that are None (`app.events.stored_json`): no bytes, no
    # size, and no workspace path (none is kept without a per-session workspace).
    assert second == [
        {"type": "file", "url": "telegram-file:doc-id", "name": "a.pdf", "mime_type": "application/pdf"}
    ]


async def test_a_wrong_secret_is_logged_once_a_minute_without_the_secret(serve: ServeApp) -> None:
    """A 401 answered in silence looks like an idle bot: the operator hears of it, once."""
    from structlog.testing import capture_logs

    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            with capture_logs() as logs:
                for n in range(5):
                    resp = await post_update(
                        client, srv.url, tg.update(20 + n, tg.message("hi")), secret="wr0ng"
                    )
                    assert resp.status_code == 401
    refused = [e for e in logs if e["event"] == "channel_request_unauthorized"]
    assert len(refused) == 1, refused
    assert refused[0]["channel"] == "telegram"
    assert refused[0]["reason"] == "X-Telegram-Bot-Api-Secret-Token does not match"
    assert "wr0ng" not in repr(logs)
