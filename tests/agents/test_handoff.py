"""/handoff across two channels: a Telegram conversation (the real PTB Bot against the
fake Bot API) continues in the linked identity's direct chat on the signed webhook, with
the same session and history, and `/handoff back` returns. Only the linked identity is
redirected."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from sqlalchemy import select

from app.api.app import create_app
from app.db.models import inbox
from tests.agents.test_links import AUTH, telegram_says
from tests.agents.test_session_commands import say, sent
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.telegram.support import tg_settings
from tests.conftest import ServeApp, make_settings, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.telegram import FakeTelegram
from tests.support.servers import serve_in_loop
from tests.support.timing import eventually


async def key_of(srv: Any, words: str) -> str:
    async with srv.runtime.engine.connect() as conn:
        rows = (await conn.execute(select(inbox.c.session_key, inbox.c.payload))).all()
    [key] = [r.session_key for r in rows if words in str(r.payload)]
    return str(key)


async def test_handoff_continues_the_session_on_the_linked_platform_and_back(serve: ServeApp) -> None:
    async with FakeTelegram() as tg_fake, FakeOpenAI() as fake:
        fake.enqueue(text("web hello"), text("Milk noted."), text("The milk."), text("own"), text("fresh"))
        channels = {"telegram": tg_settings(tg_fake), "webhook": webhook_settings()}
        running = serve(channel_settings=channels, **openai_settings(fake))
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "hello from the web", chat="u1dm", sender="u1") == "web hello"
            assert await telegram_says(client, srv, tg_fake, 1, "remember the milk") == "Milk noted."
            refused = await telegram_says(client, srv, tg_fake, 2, "/handoff webhook")
            assert refused == "You have no account on webhook linked to this one. Use /link first."
            for identity in ("telegram:4242", "webhook:u1"):
                resp = await client.post(
                    f"{srv.url}/admin/api/identity-links",
                    json={"identity": identity, "person_id": "alice"},
                    headers=AUTH,
                )
                assert resp.status_code == 200, resp.text

            done = await telegram_says(client, srv, tg_fake, 3, "/handoff webhook")
            assert done == "This conversation now continues in your direct chat on webhook."
            assert await say(client, srv, "what should I buy?", chat="u1dm", sender="u1") == "The milk."
            assert await key_of(srv, "what should I buy?") == "telegram:4242"
            assert sent(fake.requests[2]) == [
                ("user", "remember the milk"),
                ("assistant", "Milk noted."),
                ("user", "what should I buy?"),
            ]
            # someone else in that chat is not the linked identity: not redirected
            assert await say(client, srv, "me too", chat="u1dm", sender="u2") == "own"
            assert await key_of(srv, "me too") == "webhook:u1dm"

            back = await say(client, srv, "/handoff back", chat="u1dm", sender="u1")
            assert back == "Handed back: each chat has its own conversation again."
            # Telegram hears of it too, through the outbox: wait for that notice, or it could
            # be taken below for the answer to Telegram's own "/handoff back".
            await eventually(
                lambda: any(
                    c.params["text"] == "The conversation is back here, handed back from webhook."
                    for c in tg_fake.calls_of("sendMessage")
                )
            )
            assert await say(client, srv, "and now?", chat="u1dm", sender="u1") == "fresh"
            assert await key_of(srv, "and now?") == "webhook:u1dm"
            assert ("user", "remember the milk") not in sent(fake.requests[-1])
            assert ("user", "hello from the web") in sent(fake.requests[-1])
            assert await telegram_says(client, srv, tg_fake, 4, "/handoff back") == (
                "This conversation is not handed off."
            )


async def test_a_handoff_made_on_one_replica_redirects_on_the_other(pg_url: str) -> None:
    """Each replica keeps the redirected chats in memory: a handoff on replica A reaches
    replica B over the session bus (LISTEN/NOTIFY), even when B had read the set before."""
    async with FakeTelegram() as tg_fake, FakeOpenAI() as fake:
        fake.enqueue(text("web hello"), text("Milk noted."), text("The milk."))
        channels = {"telegram": tg_settings(tg_fake), "webhook": webhook_settings()}

        def replica() -> Any:
            settings = make_settings(pg_url, **openai_settings(fake))
            return serve_in_loop(create_app(settings, channel_settings=channels))

        async with replica() as a, replica() as b, httpx.AsyncClient(timeout=30) as client:
            for _ in range(100):  # B follows the bus (it subscribes as it starts)
                if b.runtime.handoffs._following:
                    break
                await asyncio.sleep(0.05)
            assert await say(client, b, "hello from the web", chat="u1dm", sender="u1") == "web hello"
            assert b.runtime.handoffs._handed_off == frozenset()  # B has read the (empty) set
            assert await telegram_says(client, a, tg_fake, 1, "remember the milk") == "Milk noted."
            for identity in ("telegram:4242", "webhook:u1"):
                resp = await client.post(
                    f"{a.url}/admin/api/identity-links",
                    json={"identity": identity, "person_id": "alice"},
                    headers=AUTH,
                )
                assert resp.status_code == 200, resp.text
            done = await telegram_says(client, a, tg_fake, 2, "/handoff webhook")
            assert done == "This conversation now continues in your direct chat on webhook."
            # The bus carries the change to B: B forgets the set it had read (a notification
            # is asynchronous; asking B before it arrived would race it).
            await eventually(lambda: b.runtime.handoffs._handed_off is None, timeout=10)

            assert await say(client, b, "what should I buy?", chat="u1dm", sender="u1") == "The milk."
            assert await key_of(b, "what should I buy?") == "telegram:4242"
