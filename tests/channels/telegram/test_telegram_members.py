"""Telegram members joining and leaving as events (docs/events.md): `chat_member` updates
and the `new_chat_members` / `left_chat_member` service messages become `joined` / `left`
events; with a welcome text the bot greets, a change reported both ways is greeted once,
promotions, bots and the bot's own membership are no events. The real app and PTB Bot, a
fake Bot API."""

from __future__ import annotations

import time

import httpx

from app.db.models import inbox
from tests.channels.support import count, wait_inbox_done
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram
from tests.support.timing import eventually

GROUP = -1001234


async def test_joins_and_leaves_are_welcomed_and_seen_off_once_whichever_way_telegram_reports_them(
    serve: ServeApp,
) -> None:
    bob, carol = tg.user(5001, "bob"), tg.user(5002, "carol")
    bob["first_name"], carol["first_name"] = "Bob", "Carol"
    robot = {**tg.user(5003, "helper_bot"), "is_bot": True}
    async with FakeTelegram() as fake:
        settings = tg_settings(fake, welcome_text="Welcome, {name}!", farewell_text="Bye, {name}.")
        async with (
            serve(channel_settings={"telegram": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            now = int(time.time())
            resp = await post_update(
                client, srv.url, tg.chat_member_update(1, bob, "left", "member", date=now)
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == f"telegram:{GROUP}"
            # The same join as a service message (the bot is an admin: it gets both).
            dup = await post_update(client, srv.url, tg.members_message(2, joined=[bob], date=now))
            assert dup.json()["duplicate"] is True
            await fake.wait_for("sendMessage", 1)
            # Not joins or leaves: a promotion, a bot added, the bot's own membership.
            await post_update(client, srv.url, tg.chat_member_update(3, bob, "member", "administrator"))
            await post_update(client, srv.url, tg.chat_member_update(4, robot, "left", "member"))
            mine = tg.chat_member_update(5, tg.bot_user(), "left", "member", by=bob, my=True)
            ignored = await post_update(client, srv.url, mine)
            assert ignored.json()["ignored"] == "the bot's own membership"
            # Two members added at once by Bob (a service message only), then Bob is removed.
            await post_update(client, srv.url, tg.members_message(6, joined=[carol, robot], by=bob))
            removed = tg.chat_member_update(7, bob, "member", "kicked", by=carol)
            await post_update(client, srv.url, removed)
            await eventually(lambda: len(fake.calls_of("sendMessage")) >= 3)
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
    assert fake.sent_texts() == ["Welcome, Bob!", "Welcome, Carol!", "Bye, Bob."]
    assert all(c.params["chat_id"] == str(GROUP) for c in fake.calls_of("sendMessage"))
    assert stored == 3


async def test_without_a_welcome_text_a_join_is_stored_and_nothing_is_said(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_update(client, srv.url, tg.members_message(1, joined=[tg.user(6001, "dan")]))
            await post_update(client, srv.url, tg.members_message(2, left=tg.user(6001, "dan")))
            await wait_inbox_done(srv.runtime)
            # A message after them is answered as usual: the events took no turn of their own.
            await post_update(client, srv.url, tg.update(3, tg.message("hello")))
            await fake.wait_for("sendMessage", 1)
            stored = await count(srv.runtime, inbox)
    assert fake.sent_texts() == ["You said: hello"]
    assert stored == 3


async def test_polling_and_set_webhook_ask_telegram_for_member_updates(serve: ServeApp) -> None:
    from channels.telegram.webhook_admin import set_webhook

    async with FakeTelegram() as fake:
        await set_webhook(tg_settings(fake), "https://bot.example.com")
        settings = tg_settings(fake, mode="polling", polling_timeout_seconds=1, welcome_text="Hi {name}")
        await fake.push_update(tg.chat_member_update(900, tg.user(7001, "erin"), "left", "member"))
        async with serve(channel_settings={"telegram": settings}):
            [welcome] = await fake.wait_for("sendMessage", 1)
    [registered] = fake.calls_of("setWebhook")
    assert "chat_member" in registered.params["allowed_updates"]
    assert "chat_member" in fake.calls_of("getUpdates")[0].params["allowed_updates"]
    assert welcome.params["text"] == "Hi Alice"
