"""Personal WeChat over iLink against the fake: long poll in, sendmessage out, on both stores."""

from __future__ import annotations

from collections import Counter

from app.db.models import inbox
from tests.channels.support import count, inbox_keys, wait_outbox_final
from tests.channels.weixin.support import saved_cursor, wx_settings
from tests.conftest import ServeApp
from tests.fakes import weixin as wx
from tests.fakes.weixin import FakeILink


async def test_a_message_in_is_answered_with_its_context_token(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        first = await fake.push(wx.text_message("hello"))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            [call] = await fake.wait_for("sendmessage", 1)
            await wait_outbox_final(srv.runtime, 1)
            assert await inbox_keys(srv.runtime) == ["weixin:alice@im.wechat"]
            # The reply is addressed as Tencent's client addresses it.
            msg = call.body["msg"]
            assert msg["to_user_id"] == "alice@im.wechat"
            assert msg["context_token"] == first["context_token"]
            assert msg["message_type"] == 2 and msg["message_state"] == 2
            assert msg["item_list"] == [{"type": 1, "text_item": {"text": "You said: hello"}}]
            assert call.headers["Authorization"] == f"Bearer {wx.TOKEN}"
            assert call.headers["AuthorizationType"] == "ilink_bot_token"
            assert call.headers["iLink-App-Id"] == "bot"
            assert int(call.headers["iLink-App-ClientVersion"]) == (2 << 16) | (4 << 8) | 9
            # A later message's token is the one used: the newest of the conversation.
            second = await fake.push(wx.text_message("again", context_token="ctx-newer"))
            await fake.wait_for("sendmessage", 2)
            assert fake.sent()[1]["context_token"] == second["context_token"] == "ctx-newer"
            # The inbox keeps the exact uint64 id (beyond a float's precision).
            async with srv.runtime.engine.connect() as conn:
                ids = [
                    r[0] for r in await conn.execute(inbox.select().with_only_columns(inbox.c.external_id))
                ]
            assert f"msg:{first['message_id']}" in ids
            assert await saved_cursor(srv.runtime.engine) is not None


async def test_a_redelivered_message_is_answered_once(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        msg = await fake.push(wx.text_message("only once"))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await fake.wait_for("sendmessage", 1)
            await fake.push(dict(msg))  # iLink gives the same message (same message_id) again
            await fake.push(wx.text_message("next"))
            await fake.wait_for("sendmessage", 2)
            await wait_outbox_final(srv.runtime, 2)
            assert await count(srv.runtime, inbox) == 2
    assert Counter(fake.sent_texts()) == Counter(["You said: only once", "You said: next"])


async def test_long_answers_are_split_at_the_limit(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        words = " ".join(f"w{i:04d}" for i in range(1500))  # ~9,000 characters
        await fake.push(wx.text_message(words))
        settings = wx_settings(fake)
        async with serve(channel_settings={"weixin": settings}) as srv:
            await wait_outbox_final(srv.runtime, 1)
    texts = fake.sent_texts()
    assert len(texts) >= 3
    assert all(len(t) <= 4000 for t in texts)
    assert "".join(texts).replace(" ", "") == f"You said: {words}".replace(" ", "")
    client_ids = [m["client_id"] for m in fake.sent()]
    assert len(set(client_ids)) == len(client_ids)  # one stable id per chunk


async def test_groups_and_direct_chats_are_separate_sessions(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        await fake.push(wx.text_message("in the group", group_id="room1@chatroom"))
        await fake.push(wx.text_message("direct"))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await wait_outbox_final(srv.runtime, 2)
            keys = await inbox_keys(srv.runtime)
    assert keys == ["weixin:room1@chatroom", "weixin:alice@im.wechat"]
    assert sorted(m["to_user_id"] for m in fake.sent()) == ["alice@im.wechat", "room1@chatroom"]


async def test_the_cursor_is_kept_across_a_restart(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        await fake.push(wx.text_message("before restart"))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await wait_outbox_final(srv.runtime, 1)
            await fake.wait_until(lambda: len(fake.calls_of("getupdates")) >= 2)
        polls_before = len(fake.calls_of("getupdates"))
        await fake.push(wx.text_message("while down"))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await wait_outbox_final(srv.runtime, 2)
            first_after = fake.calls_of("getupdates")[polls_before]
            # Resumed from the saved cursor: not from the start (which would replay everything).
            assert wx.decode_cursor(first_after.body["get_updates_buf"]) == 1
    assert fake.sent_texts() == ["You said: before restart", "You said: while down"]


async def test_a_redelivered_old_message_does_not_bring_back_an_older_token(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        old = wx.text_message("old", message_id=11, context_token="ctx-old")
        new = wx.text_message("new", message_id=12, context_token="ctx-new")
        old["create_time_ms"], new["create_time_ms"] = 1_000, 2_000
        await fake.push(old)
        await fake.push(new)
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await wait_outbox_final(srv.runtime, 2)
            await fake.push(dict(old))  # given again (a takeover): stored once, token not taken
            tokenless = wx.text_message("no token", message_id=13)
            tokenless["context_token"], tokenless["create_time_ms"] = "", 3_000
            await fake.push(tokenless)
            await wait_outbox_final(srv.runtime, 3)
    # Replies use the peer's newest token; the old message given again did not replace it.
    assert [m["context_token"] for m in fake.sent()][1:] == ["ctx-new", "ctx-new"]
    assert fake.sent_texts()[-1] == "You said: no token"
