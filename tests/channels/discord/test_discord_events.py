"""Discord's Gateway events end to end (docs/events.md): a deleted message has our answer
deleted and its exchange hidden from the model; an edit of an answered message is a note;
a reaction is a note. The real app and discord.py against a fake Gateway and REST API."""

from __future__ import annotations

from typing import Any

from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.discord.support import connected, discord_settings
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, Reply


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def test_a_deleted_message_has_our_answer_deleted_and_edits_and_reactions_are_notes(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=echo) as model, FakeDiscord() as fake:
        channel = {"discord": discord_settings(fake, streaming="off")}
        async with serve(channel_settings=channel, **openai_settings(model)) as srv:
            await connected(fake, srv)
            secret = dc.message("the vault code is 7733")
            await fake.dispatch("MESSAGE_CREATE", secret)
            [answer] = await fake.wait_for_messages(1)
            await wait_inbox_done(srv.runtime)
            answer_id = next(i for i, t in fake.texts.items() if t == "echo the vault code is 7733")
            await fake.dispatch("MESSAGE_DELETE", {"id": secret["id"], "channel_id": secret["channel_id"]})
            await fake.wait_until(lambda: any(c.method == "DELETE" for c in fake.calls))

            kept = dc.message("meet at noon")
            await fake.dispatch("MESSAGE_CREATE", kept)
            await fake.wait_for_messages(2)
            await wait_inbox_done(srv.runtime)
            edited = {
                **kept,
                "content": "meet at one",
                "edited_timestamp": "2026-12-04T12:05:00.000000+00:00",
            }
            await fake.dispatch("MESSAGE_UPDATE", edited)
            reaction = {
                "user_id": kept["author"]["id"],
                "channel_id": kept["channel_id"],
                "message_id": kept["id"],
                "emoji": {"id": None, "name": "🎉"},
            }
            await fake.dispatch("MESSAGE_REACTION_ADD", reaction)
            await fake.dispatch("MESSAGE_CREATE", dc.message("ok?"))
            await fake.wait_for_messages(3)
    [deletion] = [c for c in fake.calls if c.method == "DELETE"]
    assert deletion.path == f"/channels/{secret['channel_id']}/messages/{answer_id}"
    assert answer.body["content"] == "echo the vault code is 7733"
    last = str(model.requests[-1].messages)
    assert "7733" not in last
    assert 'edited an earlier message: "meet at noon" now reads "meet at one"' in last
    assert 'reacted with 🎉 to the message "meet at noon"' in last
