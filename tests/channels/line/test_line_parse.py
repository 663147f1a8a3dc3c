"""Webhook event shapes (from LINE's Messaging API reference) → events; no server needed."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidPayload
from app.events import ChatType, FilePart, ImagePart, NativeKind, TextPart, native_of
from channels.line.parse import parse_event, parse_events
from channels.line.settings import LineSettings

USER = "U4af4980629a0b1c2d3e4f5a6b7c8d9e0"
GROUP = "Ca56f94637c0b1c2d3e4f5a6b7c8d9e01"


def _settings(**values: Any) -> LineSettings:
    return LineSettings(_env_file=None, data_api_base_url="https://data.example", **values)  # type: ignore[call-arg]


def _event(message: dict[str, Any], source: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "type": "message",
        "mode": "active",
        "timestamp": 1_700_000_000_000,
        "source": source or {"type": "user", "userId": USER},
        "webhookEventId": "01HEVT",
        "deliveryContext": {"isRedelivery": False},
        "replyToken": "rt",
        "message": message,
        **extra,
    }


def test_a_file_and_audio_are_fetched_by_message_id_from_the_data_api() -> None:
    file_event = parse_event(
        _event({"type": "file", "id": "111", "fileName": "a.pdf", "fileSize": 3}), _settings()
    )
    assert file_event is not None
    [part] = file_event.parts
    assert isinstance(part, FilePart)
    assert (part.url, part.name, part.size) == ("https://data.example/v2/bot/message/111/content", "a.pdf", 3)
    audio = parse_event(_event({"type": "audio", "id": "222", "duration": 1000}), _settings())
    assert audio is not None and isinstance(audio.parts[0], FilePart)
    assert audio.parts[0].mime_type == "audio/m4a"


def test_content_line_does_not_hold_stays_a_reference() -> None:
    message = {
        "type": "image",
        "id": "333",
        "contentProvider": {"type": "external", "originalContentUrl": "https://elsewhere.example/x.jpg"},
    }
    event = parse_event(_event(message), _settings())
    assert event is not None and event.parts == (ImagePart(url=None),)


def test_other_events_and_standby_mode_are_ignored() -> None:
    assert parse_event({"type": "follow", "source": {"type": "user", "userId": USER}}, _settings()) is None
    assert parse_event(_event({"type": "text", "id": "1", "text": "x"}, mode="standby"), _settings()) is None


def test_a_group_member_without_a_user_id_and_the_mention_rule() -> None:
    source = {"type": "group", "groupId": GROUP}
    message = {"type": "sticker", "id": "9", "keywords": ["cat", "hello"]}
    assert parse_event(_event(message, source), _settings()) is None  # not addressed to the bot
    event = parse_event(_event(message, source), _settings(require_mention_in_groups=False))
    assert event is not None
    assert (event.chat_id, event.chat_type, event.sender_id) == (GROUP, ChatType.GROUP, f"anonymous:{GROUP}")
    assert event.parts == (TextPart(text="[sticker] cat, hello"),)


def test_a_source_without_its_id_is_invalid() -> None:
    with pytest.raises(InvalidPayload):
        parse_event(_event({"type": "text", "id": "1", "text": "x"}, {"type": "group"}), _settings())


def _native(kind: str, source: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "mode": "active",
        "timestamp": 1,
        "source": source,
        "webhookEventId": "01HN",
        **body,
    }


def test_native_events_that_say_nothing_are_ignored_and_members_are_one_event_each() -> None:
    group = {"type": "group", "groupId": GROUP}
    members = {
        "members": [{"type": "user", "userId": USER}, {"type": "user", "userId": "U2"}, {"type": "user"}]
    }
    joined = parse_events(_native("memberJoined", group, joined=members), _settings())
    assert [(e.sender_id, e.external_id, e.chat_id) for e in joined] == [
        (USER, f"event:01HN:{USER}", GROUP),
        ("U2", "event:01HN:U2", GROUP),
    ]
    assert [getattr(native_of(e), "kind", None) for e in joined] == [NativeKind.JOINED] * 2
    user = {"type": "user", "userId": USER}
    assert parse_events(_native("memberJoined", user, joined=members), _settings()) == []  # groups only
    assert parse_events(_native("postback", user, postback={"data": ""}), _settings()) == []
    assert (
        parse_events(
            _native("unsend", {"type": "group", "groupId": GROUP}, unsend={"messageId": "1"}), _settings()
        )
        == []
    )
    standby = _native("postback", user, postback={"data": "approve:1"}) | {"mode": "standby"}
    assert parse_events(standby, _settings()) == []
    [press] = parse_events(_native("postback", user, postback={"data": "approve:12"}), _settings())
    native = native_of(press)
    assert native is not None and (native.action, native.value) == ("approve", "12")
    assert press.chat_type is ChatType.DIRECT and press.metadata["reply_presser"] == USER
