"""Update parsing rules that need no server: mention forms, topics, what is ignored."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidPayload
from app.events import ChatType, NativeKind, native_of
from channels.telegram import TelegramSettings
from channels.telegram.parse import BotIdentity, parse_update
from tests.fakes import telegram as tg

ME = BotIdentity(tg.BOT_ID, tg.BOT_USERNAME)
GROUP = tg.group_chat(-100555)


def _parse(update: dict[str, Any], **settings: Any) -> Any:
    return parse_update(update, None, TelegramSettings(_env_file=None, **settings), ME)  # type: ignore[call-arg]


def _entity(kind: str, text: str, part: str, **extra: Any) -> dict[str, Any]:
    offset = len(text[: text.index(part)].encode("utf-16-le")) // 2
    return {"type": kind, "offset": offset, "length": len(part.encode("utf-16-le")) // 2, **extra}


def test_command_addressed_to_the_bot_counts_as_a_mention_and_loses_the_suffix() -> None:
    text = "/new@gate_bot"
    parsed = _parse(tg.update(1, tg.message(text, chat=GROUP, entities=[_entity("bot_command", text, text)])))
    assert parsed.event is not None
    assert parsed.event.text == "/new"
    other = "/new@other_bot"
    ignored = _parse(
        tg.update(2, tg.message(other, chat=GROUP, entities=[_entity("bot_command", other, other)]))
    )
    assert ignored.event is None


def test_text_mention_of_the_bot_counts_and_offsets_are_utf16() -> None:
    text = "😀 hey Gate, help"
    entity = _entity("text_mention", text, "Gate", user=tg.bot_user())
    parsed = _parse(tg.update(3, tg.message(text, chat=GROUP, entities=[entity])))
    assert parsed.event is not None
    assert any(p.type == "mention" and p.is_self for p in parsed.event.parts)
    emoji_then_handle = "😀 @gate_bot hi"
    mention = tg.mention_entity(emoji_then_handle)
    assert mention["offset"] == 3  # the emoji is two UTF-16 units
    assert (
        _parse(tg.update(4, tg.message(emoji_then_handle, chat=GROUP, entities=[mention]))).event is not None
    )


def test_a_mention_without_an_entity_does_not_count() -> None:
    # Telegram marks real mentions with entities; plain text that looks like one is not.
    assert _parse(tg.update(5, tg.message("@gate_bot hi", chat=GROUP))).event is None


def test_topic_messages_carry_the_topic_and_topic_creation_is_not_a_reply_to_the_bot() -> None:
    forum = tg.group_chat(-100666, forum=True)
    created = tg.message(
        None, chat=forum, sender=tg.bot_user(), forum_topic_created={"name": "T", "icon_color": 1}
    )
    msg = tg.message(
        "in topic", chat=forum, message_thread_id=9, is_topic_message=True, reply_to_message=created
    )
    assert _parse(tg.update(6, msg)).event is None  # not mentioned: the creation message is no reply
    ungated = _parse(tg.update(7, msg), require_mention_in_groups=False, session_scope="thread")
    assert ungated.event is not None
    assert ungated.event.thread_id == "9"
    assert ungated.event.session_key == "telegram:-100666:9"
    assert all(p.type != "reply_to" for p in ungated.event.parts)


def test_reply_threads_outside_forums_are_not_topics() -> None:
    msg = tg.message("hi", chat=GROUP, message_thread_id=44)
    parsed = _parse(tg.update(8, msg), require_mention_in_groups=False, session_scope="thread")
    assert parsed.event is not None
    assert parsed.event.thread_id is None
    assert parsed.event.session_key == "telegram:-100555"


@pytest.mark.parametrize(
    "update",
    [
        {"update_id": 9, "edited_message": tg.message("edit", sender={**tg.user(98), "is_bot": True})},
        {"update_id": 10, "callback_query": {"id": "1", "from": tg.user(), "chat_instance": "x"}},
        tg.update(11, tg.message("from a bot", sender={**tg.user(99), "is_bot": True})),
        tg.update(12, tg.message("channel post", chat={"id": -1007, "type": "channel", "title": "C"})),
        tg.update(13, tg.message(None)),  # no text, no media (e.g. a sticker we do not handle)
    ],
)
def test_updates_that_are_not_user_messages_are_ignored(update: dict[str, Any]) -> None:
    parsed = _parse(update)
    assert parsed.event is None
    assert parsed.ignored


def test_an_edited_message_is_an_edited_event_naming_the_message() -> None:
    original = tg.message("meet at 5")
    parsed = _parse(tg.edited_update(20, original, "meet at 6"))
    assert parsed.event is not None
    native = native_of(parsed.event)
    assert native is not None
    assert (native.kind, native.target) == (NativeKind.EDITED, str(original["message_id"]))
    assert parsed.event.text == "meet at 6"
    assert parsed.event.external_id == "update:20"
    assert parsed.event.session_key == "telegram:4242"


def test_private_chat_is_direct_and_keyed_by_chat() -> None:
    parsed = _parse(tg.update(14, tg.message("hi", chat=tg.private_chat(31), sender=tg.user(31))))
    assert parsed.event is not None
    assert parsed.event.chat_type is ChatType.DIRECT
    assert (parsed.event.session_key, parsed.event.external_id) == ("telegram:31", "update:14")
    assert "reply_msg_id" not in parsed.event.metadata


@pytest.mark.parametrize("data", [[], {"update_id": "1"}, {"update_id": 1, "message": {"chat": 5}}])
def test_malformed_updates_are_invalid_payloads(data: Any) -> None:
    with pytest.raises(InvalidPayload):
        _parse(data)
