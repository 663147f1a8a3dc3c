"""/link and /unlink across two channels: a code asked for on Telegram (the real PTB Bot
against the fake Bot API) and sent back through the signed webhook links the two
identities; the link is listed in the admin API, works once, and /unlink undoes it."""

from __future__ import annotations

import re
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import identity_links, link_codes
from tests.agents.test_session_commands import say
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def telegram_says(client: httpx.AsyncClient, srv: Any, fake: FakeTelegram, n: int, words: str) -> str:
    """A private message from user 4242 on Telegram; the bot's answer as the fake received it."""
    before = len(fake.calls_of("sendMessage"))
    resp = await post_update(client, srv.url, tg.update(n, tg.message(words)))
    assert resp.status_code == 200, resp.text
    calls = await fake.wait_for("sendMessage", before + 1)
    return str(calls[-1].params["text"])


async def linked(srv: Any) -> dict[str, str]:
    async with srv.runtime.engine.connect() as conn:
        rows = await conn.execute(select(identity_links.c.identity, identity_links.c.person_id))
        return {r.identity: r.person_id for r in rows}


async def test_link_across_telegram_and_the_webhook_then_unlink(serve: ServeApp) -> None:
    async with FakeTelegram() as fake:
        channels = {"telegram": tg_settings(fake), "webhook": webhook_settings()}
        async with serve(channel_settings=channels) as srv, httpx.AsyncClient(timeout=30) as client:
            group = await post_webhook(
                client,
                srv.url,
                WEBHOOK_SECRET,
                {"chat_id": "g1", "sender_id": "u1", "text": "/link", "chat_type": "group"},
                wait=True,
            )
            assert group.json()["replies"][0]["text"] == "Use /link in a direct chat with me."

            asked = await telegram_says(client, srv, fake, 2, "/link")
            found = re.search(r"/link ([A-Z0-9]{8})", asked)
            assert found, asked
            code = found.group(1)
            async with srv.runtime.engine.connect() as conn:
                stored = (await conn.execute(select(link_codes.c.code_hash))).scalars().all()
            assert len(stored) == 1 and code not in stored[0]  # only a hash is kept

            assert await say(client, srv, f"/link {code.lower()}", sender="u1") == (
                "Linked: your accounts now share your memory. /unlink undoes it."
            )
            links = await linked(srv)
            assert set(links) == {"telegram:4242", "webhook:u1"}
            assert links["telegram:4242"] == links["webhook:u1"]
            listed = await client.get(f"{srv.url}/admin/api/identity-links", headers=AUTH)
            assert listed.status_code == 200, listed.text
            assert {"telegram:4242", "webhook:u1"} <= {item["identity"] for item in listed.json()["links"]}

            # the code works once
            assert (await say(client, srv, f"/link {code}", sender="u2")).startswith("That code is unknown")
            assert "webhook:u2" not in await linked(srv)

            assert await say(client, srv, "/unlink", sender="u1") == "This account is no longer linked."
            assert set(await linked(srv)) == {"telegram:4242"}
            assert await say(client, srv, "/unlink", sender="u1") == "This account is not linked."


async def test_link_commands_answer_in_chinese(serve: ServeApp) -> None:
    async with serve(channel_settings={"webhook": webhook_settings(locale="zh")}) as srv:
        async with httpx.AsyncClient(timeout=30) as client:
            asked = await say(client, srv, "/link")
            assert asked.startswith("你的关联码：")
            code = re.search(r"/link (\w{8})", asked)
            assert code
            assert await say(client, srv, f"/link {code.group(1)}") == "该关联码来自此账号本身。"
            assert (await say(client, srv, "/link NOPE1234", sender="u2")).startswith("该关联码无效")
            assert await say(client, srv, "/unlink") == "此账号没有关联。"
