"""Matrix room events end to end (docs/events.md), against a real Synapse with real users:
a redacted message has our answer redacted and its exchange hidden from the model; an edit
of an answered message and a reaction are notes; ✅ on an approval prompt approves it as the
reacting member; members joining and leaving a group room are welcomed and seen off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.db.models import approvals, inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.matrix.support import MatrixAccounts, wait_synced
from tests.channels.support import count, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.support.synapse import MatrixUser, final_texts
from tests.support.timing import eventually

pytestmark = pytest.mark.xdist_group("synapse")


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


def user_texts(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


async def _answer_id(matrix: MatrixAccounts, room: str, body: str) -> str:
    found: list[str] = []

    async def answered() -> bool:
        texts = final_texts(await matrix.human.events(room), matrix.bot_id)
        found[:] = [t["event_id"] for t in texts if t["content"].get("body") == body]
        return bool(found)

    await eventually(answered, timeout=30, message=f"no answer {body!r}")
    return found[0]


async def test_a_redacted_message_has_our_answer_redacted_and_edits_and_reactions_are_notes(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with FakeOpenAI(default=echo) as model:
        settings = {"matrix": matrix.settings(streaming="off")}
        async with serve(channel_settings=settings, **openai_settings(model)) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.room_with_bot()
            secret = await matrix.human.say(room, "the vault code is 7733")
            answer = await _answer_id(matrix, room, "echo the vault code is 7733")
            await wait_inbox_done(srv.runtime)
            await matrix.human.redact(room, secret)

            async def redacted() -> bool:
                return (await matrix.human.event(room, answer)).get("content") == {}

            await eventually(redacted, timeout=30, message="our answer was not redacted")

            kept = await matrix.human.say(room, "meet at noon")
            await _answer_id(matrix, room, "echo meet at noon")
            await wait_inbox_done(srv.runtime)
            await matrix.human.edit(room, kept, "meet at one")
            await matrix.human.react(room, kept, "🎉")
            await matrix.human.say(room, "ok?")
            await _answer_id(matrix, room, "echo ok?")
            await wait_inbox_done(srv.runtime)
            # 3 messages, the redaction, the edit, the reaction; not our own redaction.
            stored = await count(srv.runtime, inbox)
    assert stored == 6
    last = str(model.requests[-1].messages)
    assert "7733" not in last
    assert 'edited an earlier message: "meet at noon" now reads "meet at one"' in last
    assert 'reacted with 🎉 to the message "meet at noon"' in last
    assert user_texts(model.requests[-1])[-1] == "ok?"


async def test_a_check_mark_reaction_on_an_approval_prompt_approves_it(
    serve: ServeApp, matrix: MatrixAccounts, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = {"matrix": matrix.settings(streaming="off", approvers=[matrix.human.user_id])}
        async with serve(
            channel_settings=settings, **openai_settings(model, workspace_root=str(tmp_path))
        ) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.room_with_bot()
            await matrix.human.say(room, "write r.txt")
            prompt: list[str] = []

            async def prompted() -> bool:
                texts = final_texts(await matrix.human.events(room), matrix.bot_id)
                prompt[:] = [t["event_id"] for t in texts if "/approve" in t["content"].get("body", "")]
                return bool(prompt)

            await eventually(prompted, timeout=30, message="no approval prompt")
            # Element's quick reactions carry a variation selector.
            await matrix.human.react(room, prompt[0], "✅\ufe0f")
            await _answer_id(matrix, room, "Written.")
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (tmp_path / "r.txt").read_text() == "ok"
    assert (decided["status"], decided["decided_by"]) == ("approved", matrix.human.user_id)


async def test_members_joining_and_leaving_a_group_room_are_welcomed_and_seen_off(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    other_id, other_token = matrix.synapse.register("other")
    other = MatrixUser(matrix.synapse.url, other_id, other_token)
    name = other_id[1:].split(":")[0]  # Synapse's default display name: the localpart
    settings = matrix.settings(streaming="off", welcome_text="Welcome, {name}!", farewell_text="Bye, {name}.")
    try:
        async with serve(channel_settings={"matrix": settings}) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.human.create_room([matrix.bot_id, other_id], direct=False)
            await eventually(lambda: _member(matrix, room), timeout=20)
            await other.join(room)
            assert await matrix.wait_answers(room, 1) == [f"Welcome, {name}!"]
            await other.leave(room)
            answers = await matrix.wait_answers(room, 2)
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
    finally:
        await other.aclose()
    # The room's creator joined before the bot: no welcome for that.
    assert answers == [f"Welcome, {name}!", f"Bye, {name}."]
    assert stored == 2


async def test_our_streamed_edits_are_not_events(serve: ServeApp, matrix: MatrixAccounts) -> None:
    answer = " ".join(f"word{i}" for i in range(40))
    async with FakeOpenAI(default=Reply(content=answer, chunk_delay=0.03)) as model:
        settings = {"matrix": matrix.settings(streaming="edit", stream_edit_seconds=0.3)}
        async with serve(
            channel_settings=settings, stream_first_preview_seconds=0.2, **openai_settings(model)
        ) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.room_with_bot()
            await matrix.human.say(room, "tell me a story")
            await eventually(lambda: _answers_are(matrix, room, [answer]), timeout=30)
            await matrix.human.say(room, "again")
            await eventually(lambda: _answers_are(matrix, room, [answer, answer]), timeout=30)
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
            events = await matrix.human.events(room)
    edits = [e for e in events if e["sender"] == matrix.bot_id and "m.new_content" in e.get("content", {})]
    assert edits, "the answers were streamed by edits"
    assert stored == 2  # the two messages; the bot's edits are not edits by a person


async def _member(matrix: MatrixAccounts, room: str) -> bool:
    return matrix.bot_id in await matrix.human.members(room)


async def _answers_are(matrix: MatrixAccounts, room: str, expected: list[str]) -> bool:
    return await matrix.answers(room) == expected


async def test_an_edit_in_a_thread_is_answered_again_there_with_the_rerun_policy(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with FakeOpenAI(default=echo) as model:
        settings = {"matrix": matrix.settings(streaming="off", edit_policy="rerun")}
        async with serve(channel_settings=settings, **openai_settings(model)) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.room_with_bot()
            root = await matrix.human.say(room, "root")
            await _answer_id(matrix, room, "echo root")
            asked = await matrix.human.say(room, "meet at noon", thread=root)
            await _answer_id(matrix, room, "echo meet at noon")
            await wait_inbox_done(srv.runtime)
            # The edit names the message, not its thread: the thread is read from the homeserver.
            await matrix.human.edit(room, asked, "meet at one")
            again = await _answer_id(matrix, room, "echo meet at one")
            answer = await matrix.human.event(room, again)
    assert answer["content"]["m.relates_to"]["rel_type"] == "m.thread"
    assert answer["content"]["m.relates_to"]["event_id"] == root
    rerun = user_texts(model.requests[-1])
    assert rerun[-1] == "meet at one" and "meet at noon" not in rerun  # the old exchange superseded
