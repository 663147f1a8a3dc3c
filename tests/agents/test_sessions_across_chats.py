"""/sessions lists the sender's conversations in their other chats on the channel (with
titles), recorded when their messages were accepted — never for a message refused by
access — and /resume stays within the chat it is sent in. Through the signed webhook, on
SQLite and PostgreSQL."""

from __future__ import annotations

import httpx
from sqlalchemy import select

from app.db.models import session_keys, session_senders, sessions
from tests.agents.test_agents import post
from tests.agents.test_session_commands import say
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.webhook import post_webhook


async def test_sessions_lists_the_senders_other_chats_and_resume_stays_in_this_chat(serve: ServeApp) -> None:
    channel = webhook_settings(require_mention_in_groups=False, allowed_chats=["g1"])
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as client:
        await say(client, srv, "hello one", chat="c1")
        await say(client, srv, "hello two", chat="c2")
        await say(client, srv, "/title Trip plans", chat="c2")
        await say(client, srv, "/new", chat="c2")
        await say(client, srv, "second in two", chat="c2")
        await post(client, srv, "hello group", chat="g1", chat_type="group")
        await say(client, srv, "not yours", chat="c3", sender="u2")
        refused = await post_webhook(
            client,
            srv.url,
            WEBHOOK_SECRET,
            {"chat_id": "secret", "sender_id": "u1", "text": "let me in", "chat_type": "group"},
        )
        assert refused.status_code < 500

        listed = await say(client, srv, "/sessions", chat="c1")
        resumed = await say(client, srv, "/resume 2", chat="c1")
        theirs = await say(client, srv, "/sessions", chat="c3", sender="u2")
        async with srv.runtime.engine.connect() as conn:
            recorded = set(
                (await conn.execute(select(session_senders.c.key, session_senders.c.identity))).all()
            )
            current = (
                await conn.execute(
                    select(sessions.c.generation)
                    .select_from(
                        session_keys.join(sessions, sessions.c.id == session_keys.c.current_session_id)
                    )
                    .where(session_keys.c.key == "webhook:c2")
                )
            ).scalar_one()

    assert recorded == {
        ("webhook:c1", "webhook:u1"),
        ("webhook:c2", "webhook:u1"),
        ("webhook:g1", "webhook:u1"),
        ("webhook:c3", "webhook:u2"),
    }  # nothing for the refused chat
    lines = listed.splitlines()
    assert lines[0] == "Conversations in this chat (* current):"
    assert lines[1].startswith("1. ") and lines[1].endswith(" *")
    assert lines[2] == "In your other chats on webhook (/resume works in the chat itself):"
    others = lines[3:]
    assert len(others) == 3
    assert any(line.startswith("- c2: 2. ") and "active" in line for line in others)
    assert "- c2: 1. Trip plans — 2 messages, expired" in others
    assert any(line.startswith("- g1: 1. ") for line in others)
    assert not any("c3" in line or "secret" in line for line in others)
    # /resume is about this chat's conversations: c2's key still points at its own current one
    assert resumed == "There is no conversation 2 here. /sessions lists them."
    assert current == 2
    # u2 sees only their own chat
    assert "In your other chats" not in theirs
