"""Roles in group chats (issue 31): commands that change the shared conversation need an
admin; the role comes from the platform (OneBot `sender.role`, Telegram's
getChatAdministrators) or the channel's settings. Through the real server and fake platforms.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import sessions
from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.discord.support import command, discord_settings, post_interaction
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.onebot.test_onebot import BOT, TOKEN, onebot_settings, ws_url
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes import feishu as fs
from tests.fakes import slack as sl
from tests.fakes import telegram as tg
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.discord import FakeDiscord
from tests.fakes.feishu import FakeFeishu
from tests.fakes.onebot import FakeBridge, group_message
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram

GROUP = 555
ONEBOT_KEY = f"onebot:group%3A{GROUP}"


async def _statuses(runtime: Any, key: str) -> list[str]:
    async with runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(sessions.c.status).where(sessions.c.key == key).order_by(sessions.c.generation)
        )
        return [r.status for r in rows]


def _at(text: str) -> list[dict[str, Any]]:
    return [{"type": "at", "data": {"qq": str(BOT)}}, {"type": "text", "data": {"text": f" {text}"}}]


def _said(action: Any) -> str:
    return "".join(s["data"].get("text", "") for s in action.params["message"] if s["type"] == "text")


async def test_onebot_member_new_is_refused_and_admin_new_is_obeyed(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
    ):
        await bridge.send_event(group_message(BOT, GROUP, 42, _at("hello")))
        await bridge.wait_for_actions(1)
        assert await _statuses(srv.runtime, ONEBOT_KEY) == ["active"]

        await bridge.send_event(group_message(BOT, GROUP, 43, _at("/new")))
        [_, refused] = await bridge.wait_for_actions(2)
        assert "Only admins of this group may use /new" in _said(refused)
        assert await _statuses(srv.runtime, ONEBOT_KEY) == ["active"]  # nothing changed
        # A member who claims more in the text is still a member: the role is the platform's.
        await bridge.send_event(group_message(BOT, GROUP, 43, _at("/reset"), role="member"))
        [*_, refused_reset] = await bridge.wait_for_actions(3)
        assert "/reset" in _said(refused_reset)
        assert await _statuses(srv.runtime, ONEBOT_KEY) == ["active"]

        await bridge.send_event(group_message(BOT, GROUP, 44, _at("/new"), role="admin"))
        [*_, obeyed] = await bridge.wait_for_actions(4)
        assert _said(obeyed) == "Started a new conversation."
        assert await _statuses(srv.runtime, ONEBOT_KEY) == ["expired"]

        # The group's owner may too; /help stays open to everyone.
        await bridge.send_event(group_message(BOT, GROUP, 45, _at("/help")))
        [*_, helped] = await bridge.wait_for_actions(5)
        assert "/new" in _said(helped)


async def test_onebot_refusal_speaks_the_channel_language_and_settings_open_or_grant(
    serve: ServeApp,
) -> None:
    settings = {"onebot": onebot_settings(locale="zh", admins=["46"])}
    async with serve(channel_settings=settings) as srv, FakeBridge(ws_url(srv), BOT, TOKEN) as bridge:
        await bridge.send_event(group_message(BOT, GROUP, 42, _at("/title 新标题")))
        [refused] = await bridge.wait_for_actions(1)
        assert _said(refused) == "只有本群的管理员可以使用 /title，未做任何更改。"
        # ONEBOT_ADMINS makes a platform member an admin here.
        await bridge.send_event(group_message(BOT, GROUP, 46, _at("/end")))
        [_, ended] = await bridge.wait_for_actions(2)
        assert "对话已结束" in _said(ended)

    opened = {"onebot": onebot_settings(conversation_commands="member")}
    async with serve(channel_settings=opened) as srv, FakeBridge(ws_url(srv), BOT, TOKEN) as bridge:
        await bridge.send_event(group_message(BOT, GROUP, 42, _at("/new")))
        [obeyed] = await bridge.wait_for_actions(1)
        assert _said(obeyed) == "Started a new conversation."


async def test_telegram_roles_come_from_chat_administrators(serve: ServeApp) -> None:
    chat = tg.group_chat(-100777)
    key = "telegram:-100777"
    admin, member = tg.user(5000, "boss"), tg.user(4242, "alice")

    def command(update_id: int, text: str, sender: dict[str, Any]) -> dict[str, Any]:
        entity = {"type": "bot_command", "offset": 0, "length": len(text)}
        return tg.update(update_id, tg.message(text, chat=chat, sender=sender, entities=[entity]))

    async with FakeTelegram() as fake:
        fake.admins[-100777] = {5000: "creator"}
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            hello = "hi @gate_bot"
            await post_update(
                client,
                srv.url,
                tg.update(
                    1, tg.message(hello, chat=chat, sender=member, entities=[tg.mention_entity(hello)])
                ),
            )
            await fake.wait_for("sendMessage", 1)
            await post_update(client, srv.url, command(2, "/new@gate_bot", member))
            await fake.wait_for("sendMessage", 2)
            assert "Only admins of this group may use /new" in fake.sent_texts()[1]
            assert await _statuses(srv.runtime, key) == ["active"]
            await post_update(client, srv.url, command(3, "/undo@gate_bot", member))
            await fake.wait_for("sendMessage", 3)
            assert "/undo" in fake.sent_texts()[2]

            await post_update(client, srv.url, command(4, "/new@gate_bot", admin))
            await fake.wait_for("sendMessage", 4)
            assert fake.sent_texts()[3] == "Started a new conversation."
            assert await _statuses(srv.runtime, key) == ["expired"]
            assert await count(srv.runtime, sessions) == 1
    # The administrators were asked once for the burst: the answer is cached.
    assert len(fake.calls_of("getChatAdministrators")) == 1


async def test_telegram_lookup_failure_leaves_a_member(serve: ServeApp) -> None:
    chat = tg.group_chat(-100778)
    async with FakeTelegram() as fake:
        fake.always["getChatAdministrators"] = tg.SERVER_ERROR
        async with (
            serve(channel_settings={"telegram": tg_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            text = "/reset@gate_bot"
            entity = {"type": "bot_command", "offset": 0, "length": len(text)}
            upd = tg.update(1, tg.message(text, chat=chat, sender=tg.user(5000), entities=[entity]))
            await post_update(client, srv.url, upd)
            await fake.wait_for("sendMessage", 1)
            assert "Only admins" in fake.sent_texts()[0]


async def test_dingtalk_admin_flag_lets_an_admin_start_over_and_not_a_member(serve: ServeApp) -> None:
    key = "dingtalk:cidGROUP001=="
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):

            async def said(count_: int) -> str:
                [*_, last] = await fake.wait_for_delivered(count_)
                return str(json.loads(last.body["msgParam"])["content"])

            await post_message(client, srv.url, dt.robot_message("hello", group=True, staff_id="bob"))
            await said(1)
            await post_message(client, srv.url, dt.robot_message("/new", group=True, staff_id="bob"))
            assert "Only admins of this group may use /new" in await said(2)
            assert await _statuses(srv.runtime, key) == ["active"]
            boss = dt.robot_message("/new", group=True, staff_id="boss", is_admin=True)
            await post_message(client, srv.url, boss)
            assert await said(3) == "Started a new conversation."
            assert await _statuses(srv.runtime, key) == ["expired"]


async def test_discord_slash_commands_carry_the_members_permissions(serve: ServeApp) -> None:
    key = "discord:2000"
    async with FakeDiscord() as fake:
        settings = discord_settings(fake, gateway=False)
        async with (
            serve(channel_settings={"discord": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_interaction(client, srv.url, command("help", interaction_id="5100"))
            await fake.wait_for_messages(1)
            assert await _statuses(srv.runtime, key) == []
            # SEND_MESSAGES | VIEW_CHANNEL only: a member.
            plain = command("new", interaction_id="5101", permissions=str((1 << 11) | (1 << 10)))
            await post_interaction(client, srv.url, plain)
            [_, refused] = await fake.wait_for_messages(2)
            assert "Only admins of this group may use /new" in refused.body["content"]
            manager = command("new", interaction_id="5102", permissions=str(1 << 5), user_id="3001")
            await post_interaction(client, srv.url, manager)
            [*_, obeyed] = await fake.wait_for_messages(3)
            assert obeyed.body["content"] == "Started a new conversation."


async def test_slack_workspace_admins_and_guests(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        fake.users = {"UADMIN": {"is_admin": True}, "UGUEST": {"is_restricted": True}}
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            first = sl.mention("hello")
            key = (await post_event(client, srv.url, sl.event_callback(first))).json()["session_key"]
            await fake.wait_for("chat.postMessage", 1)
            for n, user in enumerate(("UBOB", "UGUEST"), start=2):
                asked = sl.mention("/new", user=user, thread_ts=first["ts"])
                await post_event(client, srv.url, sl.event_callback(asked))
                await fake.wait_for("chat.postMessage", n)
                assert (
                    "Only admins of this group may use /new"
                    in fake.calls_of("chat.postMessage")[-1].params["text"]
                )
            assert await _statuses(srv.runtime, key) == ["active"]
            admin = sl.mention("/new", user="UADMIN", thread_ts=first["ts"])
            await post_event(client, srv.url, sl.event_callback(admin))
            await fake.wait_for("chat.postMessage", 4)
            assert fake.calls_of("chat.postMessage")[-1].params["text"] == "Started a new conversation."
            assert await _statuses(srv.runtime, key) == ["expired"]
    # One users.info per person who ran a command; a plain message that called no tool asked
    # nothing (roles are looked up when a command or a tool call needs them).
    looked_up = sorted(c.params["user"] for c in fake.calls_of("users.info"))
    assert looked_up == ["UADMIN", "UBOB", "UGUEST"]


async def test_feishu_group_owner_and_managers_come_from_the_chat(serve: ServeApp) -> None:
    key = "feishu:oc_team"
    async with FakeFeishu() as fake:
        fake.chats["oc_team"] = ("ou_owner", ["ou_manager"])
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.group_mention("hello", sender="ou_bob"))
            await fake.wait_for(1)
            await post_callback(client, srv.url, fs.group_mention("/new", sender="ou_bob"))
            [*_, refused] = await fake.wait_for(2)
            assert "Only admins of this group may use /new" in (refused.text or "")
            assert await _statuses(srv.runtime, key) == ["active"]
            await post_callback(client, srv.url, fs.group_mention("/new", sender="ou_manager"))
            [*_, obeyed] = await fake.wait_for(3)
            assert obeyed.text == "Started a new conversation."
            assert await _statuses(srv.runtime, key) == ["expired"]
    [asked, *_] = fake.calls_of("chat_info")
    assert asked.params == {"user_id_type": "open_id"}
    assert len(fake.calls_of("chat_info")) == 1  # cached for the chat
