"""Messages over the Gateway (discord.py against the fake Gateway): answered, deduplicated, gated."""

from __future__ import annotations

import asyncio

from sqlalchemy import update

from app.connections import fingerprint
from app.db.models import connection_leases, inbox
from tests.channels.discord.support import connected, discord_settings
from tests.channels.support import count, inbox_keys, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord


async def test_direct_message_is_answered_once_and_guild_messages_need_a_mention(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        async with serve(channel_settings={"discord": discord_settings(fake)}) as srv:
            await fake.wait_ready()
            [identify] = fake.identifies
            assert identify["token"] == dc.TOKEN
            assert identify["intents"] & (1 << 15)  # MESSAGE_CONTENT
            await fake.wait_until(lambda: srv.runtime.adapters["discord"].bot_id == dc.BOT_ID)

            dm = dc.message("hello there", channel_id="2001")
            await fake.dispatch("MESSAGE_CREATE", dm)
            await fake.dispatch("MESSAGE_CREATE", dm)  # redelivered: stored and answered once
            [reply] = await fake.wait_for_messages(1)
            assert reply.path == "/channels/2001/messages"
            assert reply.body["content"] == "You said: hello there"
            assert reply.headers["authorization"] == f"Bot {dc.TOKEN}"

            await fake.dispatch("MESSAGE_CREATE", dc.message("chatter", channel_id="2002", guild_id="9000"))
            mention = dc.message(
                f"<@{dc.BOT_ID}> ping", channel_id="2002", guild_id="9000", mentions=[dc.BOT_ID]
            )
            await fake.dispatch("MESSAGE_CREATE", mention)
            replies = await fake.wait_for_messages(2)
            await wait_outbox_final(srv.runtime, 2)
            # The mention came after the chatter in the same channel: its answer is the barrier.
            assert [(c.path, c.body["content"]) for c in fake.messages()] == [
                ("/channels/2001/messages", "You said: hello there"),
                ("/channels/2002/messages", "You said: ping"),
            ]
            assert len(replies) == 2
            assert await count(srv.runtime, inbox) == 2
            assert sorted(await inbox_keys(srv.runtime)) == ["discord:2001", "discord:2002"]


async def test_a_dropped_gateway_is_resumed_and_messages_flow_again(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        async with serve(channel_settings={"discord": discord_settings(fake)}) as srv:
            await connected(fake, srv)
            await fake.wait_until(lambda: fake.heartbeats >= 1, timeout=10)
            await fake.drop_connections()
            await fake.wait_until(lambda: bool(fake.resumes), timeout=20)
            [resume] = fake.resumes
            assert resume["token"] == dc.TOKEN and resume["session_id"] == "session-1"
            await fake.dispatch("MESSAGE_CREATE", dc.message("after resume", channel_id="2003"))
            [reply] = await fake.wait_for_messages(1)
            assert reply.body["content"] == "You said: after resume"


async def test_long_replies_are_split_at_2000_characters(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        async with serve(channel_settings={"discord": discord_settings(fake)}) as srv:
            await fake.wait_ready()
            await fake.dispatch("MESSAGE_CREATE", dc.message("x" * 2500, channel_id="2004"))
            chunks = await fake.wait_for_messages(2)
            await wait_outbox_final(srv.runtime)
            assert all(len(c.body["content"]) <= 2000 for c in chunks)
            assert "".join(c.body["content"] for c in chunks) == "You said: " + "x" * 2500


async def test_a_saved_session_the_gateway_no_longer_knows_falls_back_to_identify(serve: ServeApp) -> None:
    async with FakeDiscord() as fake:
        async with serve(channel_settings={"discord": discord_settings(fake)}) as srv:
            name = f"discord:{fingerprint(dc.TOKEN)}"
            await connected(fake, srv)
            # The first holder saved its session; what a takeover would RESUME.
            async with asyncio.timeout(10):
                while (saved := await srv.runtime.connections.load_state(name)) is None:
                    await asyncio.sleep(0.05)
            assert saved["session_id"] == "session-1" and saved["resume_gateway_url"] == fake.gateway_url
        async with srv.runtime.engine.begin() as conn:  # a session Discord has since forgotten
            await conn.execute(
                update(connection_leases).values(state={**saved, "session_id": "session-gone"})
            )
        async with serve(channel_settings={"discord": discord_settings(fake)}) as srv:
            await fake.wait_until(lambda: len(fake.identifies) == 2, timeout=20)
            assert [r["session_id"] for r in fake.resumes] == ["session-gone"]  # tried first
            await fake.dispatch("MESSAGE_CREATE", dc.message("after identify", channel_id="2005"))
            [reply] = await fake.wait_for_messages(1)
            assert reply.body["content"] == "You said: after identify"
