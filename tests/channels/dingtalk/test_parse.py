"""Robot messages → events, and the callback signature, without a server."""

from __future__ import annotations

import time

import pytest

from app.errors import ChannelAuthError, InvalidPayload
from app.events import ChatType, ImagePart, MentionPart, SessionScope
from channels.dingtalk import DingTalkSettings
from channels.dingtalk.parse import parse_message
from channels.dingtalk.signing import verify
from tests.fakes import dingtalk as dt


def _settings(**values: object) -> DingTalkSettings:
    return DingTalkSettings(_env_file=None, **values)  # type: ignore[arg-type]


def test_group_message_keeps_the_conversation_the_mention_and_the_webhook() -> None:
    message = dt.robot_message(
        "  what is new ", group=True, staff_id="bob", webhook="https://x/robot?session=s"
    )
    event = parse_message(message, _settings()).event
    assert event is not None
    assert (event.chat_id, event.sender_id, event.chat_type) == ("cidGROUP001==", "bob", ChatType.GROUP)
    assert event.text == "what is new"
    assert event.external_id == message["msgId"]
    assert MentionPart(user_id=dt.BOT_USER_ID, is_self=True) in event.parts
    assert event.metadata["reply_session_webhook"] == "https://x/robot?session=s"
    assert event.metadata["reply_conversation_type"] == "2"
    assert event.metadata["chat_title"] == "Team"


def test_user_in_chat_scope_gives_each_member_of_a_group_a_session() -> None:
    settings = _settings(session_scope=SessionScope.USER_IN_CHAT)
    event = parse_message(dt.robot_message("hi", group=True, staff_id="bob"), settings).event
    assert event is not None
    assert event.session_key == "dingtalk:cidGROUP001==:user:bob"


def test_people_outside_the_organisation_are_keyed_by_sender_id() -> None:
    message = dt.robot_message("hi")
    del message["senderStaffId"]
    event = parse_message(message, _settings()).event
    assert event is not None
    assert event.chat_id == "$:LWCP_v1:$staff-alice"


def test_rich_text_and_pictures_carry_download_codes_and_other_types_are_ignored() -> None:
    event = parse_message(dt.robot_message("rich words", rich=True), _settings()).event
    assert event is not None and event.text == "rich words"
    assert [p.url for p in event.parts if isinstance(p, ImagePart)] == ["dingtalk-download:dc"]
    picture = dt.robot_message("x")
    picture["msgtype"] = "picture"
    picture["content"] = {"downloadCode": "dc"}
    event = parse_message(picture, _settings()).event
    assert event is not None and [p.type for p in event.parts] == ["image"]
    card = dt.robot_message("x")
    card["msgtype"] = "interactiveCard"
    assert parse_message(card, _settings()).ignored == "message type interactiveCard is not supported"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"msgId": None}, "msgId"),
        ({"conversationType": "3"}, "conversationType"),
        ({"text": {"nope": 1}}, "text.content"),
        ({"senderStaffId": None, "senderId": None}, "senderStaffId"),
    ],
)
def test_malformed_messages_are_refused_with_the_reason(change: dict[str, object], reason: str) -> None:
    message = {**dt.robot_message("x"), **change}
    with pytest.raises(InvalidPayload, match=reason):
        parse_message(message, _settings())


def test_signature_follows_the_published_rule_and_the_one_hour_window() -> None:
    now = time.time()
    headers = dt.signed_headers(secret="s3cret", timestamp_ms=int(now * 1000))
    verify("s3cret", headers, now=now)
    with pytest.raises(ChannelAuthError, match="sign does not match"):
        verify("other", headers, now=now)
    with pytest.raises(ChannelAuthError, match="away from server time"):
        verify("s3cret", headers, now=now + 3601)
    verify("s3cret", headers, now=now + 3599)
    with pytest.raises(ChannelAuthError, match="milliseconds"):
        verify("s3cret", {**headers, "timestamp": "soon"}, now=now)


def test_an_organization_admin_in_a_group_has_the_admin_role() -> None:
    admin = parse_message(dt.robot_message("hi", group=True, is_admin=True), _settings()).event
    member = parse_message(dt.robot_message("hi", group=True), _settings()).event
    direct = parse_message(dt.robot_message("hi", is_admin=True), _settings()).event
    assert admin is not None and member is not None and direct is not None
    assert admin.metadata["role"] == "admin"
    assert "role" not in member.metadata and "role" not in direct.metadata
