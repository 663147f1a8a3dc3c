"""Matrix against a real Synapse homeserver: /sync in, room messages out, on both stores."""

from __future__ import annotations

import base64
from collections import Counter

import httpx
import pytest
from sqlalchemy import select, update

from app.db.models import connection_leases, inbox, messages
from app.events import ImagePart, OutboundMessage, SessionScope, TextPart, build_session_key
from channels.matrix import MatrixChannel
from tests.channels.matrix.support import MatrixAccounts, saved_next_batch, wait_synced
from tests.channels.support import count, inbox_keys, llm_settings, send_only_context, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.support.synapse import MatrixUser, final_texts
from tests.support.timing import eventually

ANSWER = " ".join(f"word{i}" for i in range(60))
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

# One Synapse per test worker: keep these tests on one worker (scripts/test.sh, loadgroup).
pytestmark = pytest.mark.xdist_group("synapse")


async def test_a_message_is_answered_in_the_room_and_a_thread_is_its_own_session(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with serve(channel_settings={"matrix": matrix.settings(streaming="off")}) as srv:
        await wait_synced(srv.runtime.engine)
        room = await matrix.room_with_bot()
        asked = await matrix.human.say(room, "hello")
        assert await matrix.wait_answers(room, 1) == ["You said: hello"]
        # A thread under that message: its own session, answered inside the thread.
        await matrix.human.say(room, "in the thread", thread=asked)
        await matrix.wait_answers(room, 2)
        await wait_outbox_final(srv.runtime, 2)
        keys = await inbox_keys(srv.runtime)
        events = await matrix.human.events(room)
    assert keys == [
        build_session_key("matrix", room, SessionScope.THREAD),
        build_session_key("matrix", room, SessionScope.THREAD, thread_id=asked),
    ]
    first, second = final_texts(events, matrix.bot_id)
    assert first["content"]["body"] == "You said: hello"
    assert "m.relates_to" not in first["content"]  # a direct chat: a plain answer
    assert second["content"]["body"] == "You said: in the thread"
    assert second["content"]["m.relates_to"]["rel_type"] == "m.thread"
    assert second["content"]["m.relates_to"]["event_id"] == asked


async def test_in_a_group_room_only_a_mention_is_answered_as_a_reply(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    other_id, other_token = matrix.synapse.register("other")
    other = MatrixUser(matrix.synapse.url, other_id, other_token)
    try:
        async with serve(channel_settings={"matrix": matrix.settings(streaming="off")}) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.human.create_room([matrix.bot_id, other_id], direct=False)
            await other.join(room)
            await eventually(lambda: _member(matrix, room), timeout=20)
            await matrix.human.say(room, "just chatting among ourselves")
            mention = {
                "msgtype": "m.text",
                "body": "gate: hello?",
                "m.mentions": {"user_ids": [matrix.bot_id]},
            }
            asked = await matrix.human.send(room, mention)
            await matrix.wait_answers(room, 1)
            await wait_outbox_final(srv.runtime, 1)
            stored = await count(srv.runtime, inbox)
            events = await matrix.human.events(room)
    finally:
        await other.aclose()
    assert stored == 1  # the message without a mention was not for the bot
    [answer] = final_texts(events, matrix.bot_id)
    assert answer["content"]["body"].endswith("gate: hello?")
    assert answer["content"]["m.relates_to"] == {"m.in_reply_to": {"event_id": asked}}


async def _member(matrix: MatrixAccounts, room: str) -> bool:
    return matrix.bot_id in await matrix.human.members(room)


async def test_a_streamed_answer_is_one_message_edited_in_place(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm:
        settings = matrix.settings(streaming="edit", stream_edit_seconds=0.4)
        async with serve(
            channel_settings={"matrix": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
        ) as srv:
            await wait_synced(srv.runtime.engine)
            room = await matrix.room_with_bot()
            await matrix.human.say(room, "tell me a story")
            [row] = await wait_outbox_final(srv.runtime)
            await eventually(lambda: _last_edit_is(matrix, room, ANSWER), timeout=20)
            events = await matrix.human.events(room)
    [answer] = final_texts(events, matrix.bot_id)
    assert row["status"] == "sent" and row["platform_message_id"] == answer["event_id"]
    assert answer["content"]["body"] == ANSWER
    assert answer["edits"] >= 1, "the answer is the preview's last edit, not a second message"
    original = next(e for e in events if e["event_id"] == answer["event_id"])
    assert original["content"]["body"] != ANSWER  # the preview began with part of the answer


async def _last_edit_is(matrix: MatrixAccounts, room: str, text: str) -> bool:
    return await matrix.answers(room) == [text]


async def test_an_encrypted_room_gets_one_notice_and_its_messages_are_ignored(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with serve(channel_settings={"matrix": matrix.settings(streaming="off")}) as srv:
        await wait_synced(srv.runtime.engine)
        room = await matrix.room_with_bot(encrypted=True)
        [notice] = await matrix.wait_answers(room, 1)
        # What clients send there (ciphertext), and a plain message for good measure.
        await matrix.human.send(
            room,
            {
                "algorithm": "m.megolm.v1.aes-sha2",
                "ciphertext": "AwgAEn…",
                "session_id": "s",
                "device_id": "D",
            },
            event_type="m.room.encrypted",
        )
        await matrix.human.say(room, "can you read this?")
        # A plain room afterwards is answered: the sync went past the encrypted room's events.
        plain = await matrix.room_with_bot()
        await matrix.human.say(plain, "and this?")
        assert await matrix.wait_answers(plain, 1) == ["You said: and this?"]
        events = await matrix.human.events(room)
        stored = await count(srv.runtime, inbox)
    assert "end-to-end encrypted" in notice and "not supported" in notice
    [only] = final_texts(events, matrix.bot_id)
    assert only["content"]["msgtype"] == "m.notice"
    assert stored == 1  # only the plain room's message


async def test_events_given_again_are_answered_once(serve: ServeApp, matrix: MatrixAccounts) -> None:
    settings = matrix.settings(streaming="off")
    async with serve(channel_settings={"matrix": settings}) as srv:
        await wait_synced(srv.runtime.engine)
        room = await matrix.room_with_bot()
        rewind = await saved_next_batch(srv.runtime.engine)  # before the message
        await matrix.human.say(room, "only once")
        await matrix.wait_answers(room, 1)
        await wait_outbox_final(srv.runtime, 1)
        engine = srv.runtime.engine
        # As if the holder died before saving its token: the next one syncs from the old one.
        async with engine.begin() as conn:
            await conn.execute(
                update(connection_leases)
                .where(connection_leases.c.name.like("matrix:%"))
                .values(state={"next_batch": rewind})
            )
    async with serve(channel_settings={"matrix": settings}) as srv:
        adapter = srv.runtime.adapters["matrix"]
        assert isinstance(adapter, MatrixChannel)
        await eventually(lambda: adapter.duplicates >= 1, timeout=20, message="the event was not given again")
        await matrix.human.say(room, "next")
        await matrix.wait_answers(room, 2)
        await wait_outbox_final(srv.runtime, 2)
        stored = await count(srv.runtime, inbox)
        answers = await matrix.answers(room)
    assert stored == 2
    assert Counter(answers) == Counter(["You said: only once", "You said: next"])


async def test_an_image_comes_from_the_content_repository_and_answers_upload_theirs(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    async with serve(channel_settings={"matrix": matrix.settings(streaming="off")}) as srv:
        await wait_synced(srv.runtime.engine)
        room = await matrix.room_with_bot()
        uri = await matrix.human.upload(PIXEL, "image/png", "pixel.png")
        await matrix.human.send(
            room, {"msgtype": "m.image", "body": "pixel.png", "url": uri, "info": {"mimetype": "image/png"}}
        )
        await matrix.wait_answers(room, 1)
        async with srv.runtime.engine.connect() as conn:
            [parts] = (
                await conn.execute(select(messages.c.parts).where(messages.c.role == "user"))
            ).scalars()
    images = [p for p in parts if p.get("type") == "image"]
    assert [p["data_base64"] for p in images] == [base64.b64encode(PIXEL).decode()]
    # Sending: the file is uploaded, the message points at it.
    async with httpx.AsyncClient(timeout=30) as http:
        channel = MatrixChannel(matrix.settings(), send_only_context(http))
        try:
            picture = ImagePart(data_base64=base64.b64encode(PIXEL).decode(), mime_type="image/png")
            await channel.send(
                OutboundMessage(channel="matrix", chat_id=room, parts=(TextPart(text="here"), picture))
            )
        finally:
            await channel.stop()
    sent = [e for e in await matrix.human.events(room) if e["sender"] == matrix.bot_id]
    image = sent[-1]["content"]
    assert sent[-2]["content"]["body"] == "here"
    assert image["msgtype"] == "m.image" and image["info"]["mimetype"] == "image/png"
    assert await matrix.human.download(image["url"]) == PIXEL


async def test_messages_past_a_limited_timeline_are_fetched_back(
    serve: ServeApp, matrix: MatrixAccounts
) -> None:
    settings = matrix.settings(streaming="off", sync_timeline_limit=2)
    async with serve(channel_settings={"matrix": settings}) as srv:
        await wait_synced(srv.runtime.engine)
        room = await matrix.room_with_bot()
    for i in range(6):  # while the gateway is down: more than one sync's timeline holds
        await matrix.human.say(room, f"missed {i}")
    async with serve(channel_settings={"matrix": settings}) as srv:
        await matrix.wait_answers(room, 6)
        await wait_outbox_final(srv.runtime, 6)
        answers = await matrix.answers(room)
    assert answers == [f"You said: missed {i}" for i in range(6)]
