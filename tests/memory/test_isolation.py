"""Recall comes only from the session itself, its sender and global facts (both backends).

Each test asserts on what the model actually received: a recording provider keeps
every request, and the system text of a run is where recalled memory goes.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from sqlalchemy import select

from app.db.models import memories
from app.events import InboundEvent
from app.memory import IdentityLinks, identity_of
from channels.cli import CliSettings
from tests.conftest import ServeApp, webhook_settings
from tests.memory.support import RecordingProvider, is_summary_request, request_text, say

# Tiny thresholds: every couple of turns is consolidated, so stated preferences become
# user facts through the consolidation path too, not only through `remember`.
SMALL = {"consolidation_threshold_messages": 4, "consolidation_keep_messages": 2}


async def test_two_users_in_two_sessions_never_see_each_others_memory(serve: ServeApp) -> None:
    provider = RecordingProvider()
    async with serve(provider=provider, **SMALL) as srv, httpx.AsyncClient(timeout=30) as client:
        await say(client, srv.url, "chat-a", "alice", "I prefer green tea.")
        await say(client, srv.url, "chat-a", "alice", "remember: Alice's locker code is 4711")
        await say(client, srv.url, "chat-a", "alice", "remember for this chat: we plan the Lisbon trip")
        await say(client, srv.url, "chat-a", "alice", "thanks")

        mark = len(provider.calls)
        await say(client, srv.url, "chat-b", "bob", "I prefer black coffee.")
        await say(client, srv.url, "chat-b", "bob", "remember: Bob's locker code is 1234")
        await say(client, srv.url, "chat-b", "bob", "what do I like?")
        await say(client, srv.url, "chat-b", "bob", "and what else?")
        bob_calls = provider.since(mark)
        assert bob_calls
        for call in bob_calls:
            seen = request_text(call)
            assert "green tea" not in seen
            assert "4711" not in seen
            assert "Lisbon" not in seen
        # Bob's own memory does reach Bob's runs (the recall is real, not just empty).
        assert "Bob's locker code is 1234" in (bob_calls[-1][0].content or "")
        assert "black coffee" in (bob_calls[-1][0].content or "")

        mark = len(provider.calls)
        await say(client, srv.url, "chat-a", "alice", "what do I like?")
        [alice_run] = provider.since(mark)[:1]
        system = alice_run[0].content or ""
        assert "green tea" in system
        assert "4711" in system
        assert "Lisbon" in system
        assert "1234" not in request_text(alice_run)
        assert "black coffee" not in request_text(alice_run)

        # Consolidation's own summary requests each carry one session only.
        for call in provider.calls:
            if is_summary_request(call):
                seen = request_text(call)
                assert not ("green tea" in seen and "black coffee" in seen)

        async with srv.runtime.engine.connect() as conn:
            rows = (await conn.execute(select(memories.c.scope, memories.c.owner))).all()
        owners = {(scope, owner) for scope, owner in rows}
        assert ("user", identity_of("webhook", "alice")) in owners
        assert ("user", identity_of("webhook", "bob")) in owners
        assert ("session", "webhook:chat-a") in owners


async def test_group_with_user_in_chat_scope_keeps_members_apart(serve: ServeApp) -> None:
    provider = RecordingProvider()
    channels = {"webhook": webhook_settings(session_scope="user_in_chat")}
    async with (
        serve(provider=provider, channel_settings=channels, **SMALL) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        group = {"chat_type": "group"}
        first = await say(client, srv.url, "room", "alice", "I prefer window seats.", **group)
        assert first["session_key"] == "webhook:room:user:alice"
        await say(client, srv.url, "room", "alice", "remember: Alice's badge is A-77", **group)
        await say(client, srv.url, "room", "alice", "ok", **group)

        mark = len(provider.calls)
        other = await say(client, srv.url, "room", "bob", "I prefer aisle seats.", **group)
        assert other["session_key"] == "webhook:room:user:bob"
        await say(client, srv.url, "room", "bob", "remember: Bob's badge is B-12", **group)
        await say(client, srv.url, "room", "bob", "which seat do I like?", **group)
        await say(client, srv.url, "room", "bob", "thanks", **group)
        for call in provider.since(mark):
            seen = request_text(call)
            assert "window seats" not in seen
            assert "A-77" not in seen
        assert "B-12" in (provider.since(mark)[-1][0].content or "")

        mark = len(provider.calls)
        await say(client, srv.url, "room", "alice", "which seat do I like?", **group)
        alice_seen = request_text(provider.since(mark)[0])
        assert "window seats" in alice_seen and "A-77" in alice_seen
        assert "aisle seats" not in alice_seen and "B-12" not in alice_seen


async def test_linked_identities_share_user_memory_across_channels(serve: ServeApp) -> None:
    provider = RecordingProvider()
    channels = {"webhook": webhook_settings(), "cli": CliSettings(_env_file=None)}  # type: ignore[call-arg]
    async with (
        serve(provider=provider, channel_settings=channels) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        runtime = srv.runtime
        await say(client, srv.url, "dm-alice", "alice-wh", "remember: Alice is vegetarian")
        links = IdentityLinks(runtime.engine)
        await links.link(identity_of("webhook", "alice-wh"), "alice")
        await links.link(identity_of("cli", "alice-term"), "alice")

        async def cli_say(sender: str, text: str) -> None:
            [accepted] = await runtime.ingest.submit([InboundEvent.from_text("cli", sender, sender, text)])
            done = await runtime.waiters.wait_for_replies(accepted.event_id, 20)
            assert done.done

        mark = len(provider.calls)
        await cli_say("alice-term", "what do I eat?")
        assert "Alice is vegetarian" in (provider.since(mark)[0][0].content or "")

        # A fact stored from the terminal reaches the webhook identity too.
        await cli_say("alice-term", "remember: Alice's cat is called Miso")
        mark = len(provider.calls)
        await say(client, srv.url, "dm-alice", "alice-wh", "what is my cat called?")
        assert "Miso" in (provider.since(mark)[0][0].content or "")

        # An identity that is not linked sees none of it.
        mark = len(provider.calls)
        await cli_say("mallory", "what do you know about me?")
        for call in provider.since(mark):
            assert "vegetarian" not in request_text(call) and "Miso" not in request_text(call)

        # Unlinking stops the sharing for that identity.
        assert await links.unlink(identity_of("cli", "alice-term"))
        mark = len(provider.calls)
        await cli_say("alice-term", "and now?")
        assert "vegetarian" not in request_text(provider.since(mark)[0])


async def test_global_facts_reach_every_session(serve: ServeApp, tmp_path: Path) -> None:
    facts = tmp_path / "facts.md"
    facts.write_text("# operator facts\n- The office wifi is called sunflower.\n\nSupport hours are 9-17.\n")
    provider = RecordingProvider()
    async with (
        serve(provider=provider, memory_global_file=str(facts)) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for chat, sender in (("c1", "alice"), ("c2", "bob")):
            mark = len(provider.calls)
            await say(client, srv.url, chat, sender, "hi")
            system = provider.since(mark)[0][0].content or ""
            assert "The office wifi is called sunflower." in system
            assert "Support hours are 9-17." in system
            assert "operator facts" not in system  # comments are not facts

        # Reloading a changed file replaces the file's facts.
        facts.write_text("Support hours are 8-16.\n")
        await srv.runtime.memory.store.sync_global_file(facts)
        mark = len(provider.calls)
        await say(client, srv.url, "c3", "carol", "hi")
        system = provider.since(mark)[0][0].content or ""
        assert "8-16" in system and "9-17" not in system and "sunflower" not in system


async def test_memory_disabled_recalls_nothing_and_offers_no_tools(serve: ServeApp) -> None:
    provider = RecordingProvider()
    async with serve(provider=provider, memory_enabled=False) as srv, httpx.AsyncClient(timeout=30) as client:
        assert "remember" not in srv.runtime.tools and "recall" not in srv.runtime.tools
        await say(client, srv.url, "c", "u", "I prefer tea.")
        assert "Long-term memory" not in (provider.since(0)[-1][0].content or "")


async def test_shared_group_sessions_can_keep_personal_memory_out(serve: ServeApp) -> None:
    provider = RecordingProvider()
    async with (
        serve(provider=provider, memory_user_recall_in_shared_groups=False) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await say(client, srv.url, "dm-alice", "alice", "remember: Alice's salary is 5000")
        mark = len(provider.calls)
        reply = await say(
            client, srv.url, "room", "alice", "remember: I like the blue sofa", chat_type="group"
        )
        assert "personal memory is off" in reply["replies"][0]["text"]
        for call in provider.since(mark):
            assert "5000" not in request_text(call)
        await say(
            client, srv.url, "room", "alice", "remember for this chat: sofa vote on Monday", chat_type="group"
        )
        mark = len(provider.calls)
        await say(client, srv.url, "room", "bob", "when is the vote?", chat_type="group")
        system = provider.since(mark)[0][0].content or ""
        assert "sofa vote on Monday" in system and "5000" not in system
        # With the option on (the default), the sender's own memory is recalled in the room.
        srv.runtime.memory.recall.user_in_shared_groups = True
        mark = len(provider.calls)
        await say(client, srv.url, "room", "alice", "hi", chat_type="group")
        assert "5000" in (provider.since(mark)[0][0].content or "")
