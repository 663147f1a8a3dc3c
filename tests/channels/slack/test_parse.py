"""Event parsing rules that need no server: conversation kinds, threads, files, what is ignored."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidPayload
from app.events import ChatType
from channels.slack import SlackSettings
from channels.slack.parse import parse_event_callback
from tests.fakes import slack as sl


def _parse(event: dict[str, Any], bot_user_id: str | None = sl.BOT_USER_ID, **settings: Any) -> Any:
    s = SlackSettings(_env_file=None, **settings)  # type: ignore[call-arg]
    return parse_event_callback(sl.event_callback(event), s, bot_user_id)


def test_message_event_with_a_mention_counts_and_the_tag_is_removed() -> None:
    event = sl.channel_message(f"hey <@{sl.BOT_USER_ID}>   /new")
    parsed = _parse(event)
    assert parsed.event is not None
    assert parsed.event.text == "hey /new"
    assert parsed.event.external_id == f"C0GENERAL:{event['ts']}"
    assert parsed.event.metadata["slack_event_id"].startswith("Ev")


def test_group_dm_is_a_group_and_needs_a_mention() -> None:
    mpim = sl.channel_message("hi all", channel="G0MPIM", channel_type="mpim")
    assert _parse(mpim).event is None
    parsed = _parse(mpim, require_mention_in_groups=False)
    assert parsed.event is not None and parsed.event.chat_type is ChatType.GROUP


def test_dm_in_a_thread_stays_in_that_thread() -> None:
    parsed = _parse(sl.dm("inside", thread_ts="1700000000.000100"))
    assert parsed.event is not None
    assert parsed.event.thread_id == "1700000000.000100"
    assert parsed.event.session_key == "slack:D0ALICE:1700000000.000100"


def test_chat_scope_keeps_one_session_per_channel_while_replying_in_threads() -> None:
    event = sl.mention("hi")
    parsed = _parse(event, session_scope="chat")
    assert parsed.event is not None
    assert parsed.event.thread_id == event["ts"]  # the reply still goes to a thread
    assert parsed.event.session_key == "slack:C0GENERAL"


def test_files_become_image_and_file_parts() -> None:
    files = [
        {
            "id": "F1",
            "name": "cat.png",
            "mimetype": "image/png",
            "url_private": "https://files.slack.com/cat.png",
        },
        {
            "id": "F2",
            "name": "a.pdf",
            "mimetype": "application/pdf",
            "size": 10,
            "url_private": "https://f/a.pdf",
        },
    ]
    parsed = _parse(sl.dm("", subtype="file_share", files=files))
    assert parsed.event is not None
    kinds = [(p.type, getattr(p, "url", None)) for p in parsed.event.parts]
    assert kinds == [("image", "https://files.slack.com/cat.png"), ("file", "https://f/a.pdf")]


def test_without_a_known_bot_user_id_mentions_still_work_through_app_mention() -> None:
    parsed = _parse(sl.mention("hello"), bot_user_id=None)
    assert parsed.event is not None
    assert _parse(sl.channel_message(f"<@{sl.BOT_USER_ID}> x"), bot_user_id=None).event is None


@pytest.mark.parametrize(
    "event",
    [
        {"type": "reaction_added", "user": "U1", "reaction": "+1"},
        sl.dm("x", subtype="channel_join"),
        sl.dm("x", subtype="message_deleted"),
        {"type": "message", "channel": "D1", "ts": "1.1", "channel_type": "im", "text": "no user"},
        sl.dm(""),
    ],
)
def test_events_that_are_not_user_messages_are_ignored(event: dict[str, Any]) -> None:
    parsed = _parse(event)
    assert parsed.event is None
    assert parsed.ignored


def test_event_callback_without_event_is_invalid() -> None:
    with pytest.raises(InvalidPayload):
        parse_event_callback({"type": "event_callback"}, SlackSettings(_env_file=None), sl.BOT_USER_ID)  # type: ignore[call-arg]
