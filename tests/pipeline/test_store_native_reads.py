"""The port's reads for platform-native events (docs/events.md), on every store: an event by
the platform's id of its message, our replies to an event that reached the platform, and
a reply of ours by its platform id."""

from __future__ import annotations

from sqlalchemy import update

from app.db.models import outbox
from app.events import MESSAGE_REF_KEY, InboundEvent, NativeEvent, NativeKind
from app.outbox_rows import outbox_values
from app.pipeline.replies import reply_for
from app.pipeline.storage.port import Answer, PipelineStore
from tests.pipeline.conftest import engine_of
from tests.pipeline.support import KEY, lease_of


def _message(text: str, ref: str) -> InboundEvent:
    return InboundEvent.from_text(
        "webhook", "c", "u", text, external_id=f"m{ref}", metadata={MESSAGE_REF_KEY: ref}
    )


async def test_an_event_is_found_by_its_message_ref_and_native_events_are_not(store: PipelineStore) -> None:
    first, second = _message("one", "11"), _message("two", "12")
    edit = InboundEvent.native(
        NativeEvent(kind=NativeKind.EDITED, target="11"),
        channel="webhook",
        chat_id="c",
        sender_id="u",
        text="one!",
        external_id="e1",
        metadata={MESSAGE_REF_KEY: "11"},  # even if an adapter copied it: an event about it
    )
    await store.accept([first, second, edit])
    found = await store.inbox_by_ref(KEY, ["11", "12", "99"])
    assert sorted(found) == ["11", "12"]
    assert found["11"].event_id == first.event_id and found["11"].event.text == "one"
    assert found["11"].waiting and found["11"].status == "pending"
    assert await store.inbox_by_ref("webhook:other", ["11"]) == {}

    lease = await lease_of(store)
    rows = await store.next_rows(KEY, 1)
    await store.answer(lease, Answer([rows[0].id]))
    found = await store.inbox_by_ref(KEY, ["11"])
    assert not found["11"].waiting and found["11"].status == "done"


async def test_sent_replies_and_a_reply_by_its_platform_id(store: PipelineStore) -> None:
    asked = _message("hello", "21")
    await store.accept([asked])
    lease = await lease_of(store)
    [row] = await store.next_rows(KEY, 1)
    replies = [
        outbox_values(reply_for(asked, text), session_id=None, run_id=None, event_id=asked.event_id)
        for text in ("part 1", "part 2")
    ]
    await store.answer(lease, Answer([row.id], replies))
    assert await store.sent_replies(asked.event_id) == []  # not sent yet: nothing to delete
    async with engine_of(store).begin() as conn:
        await conn.execute(
            update(outbox)
            .where(outbox.c.message_id == replies[0]["message_id"])
            .values(platform_message_id="p1")
        )
    [sent] = await store.sent_replies(asked.event_id)
    assert sent.platform_message_id == "p1" and sent.message.text == "part 1"
    ours = await store.reply_by_platform_id(KEY, "p1")
    assert ours is not None and ours.text == "part 1"
    assert await store.reply_by_platform_id(KEY, "p2") is None
    assert await store.reply_by_platform_id("webhook:other", "p1") is None
