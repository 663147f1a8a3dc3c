"""Matrix room events → inbound events: what is answered, and under which key."""

from __future__ import annotations

from typing import Any

from app.events import ChatType, FilePart, ImagePart, MentionPart, ReplyToPart, TextPart
from channels.matrix.api import media_url
from channels.matrix.parse import parse_message, strip_reply_fallback
from channels.matrix.settings import MatrixSettings

BOT = "@gate:example.org"
ROOM = "!room:example.org"
SETTINGS = MatrixSettings(_env_file=None)  # type: ignore[call-arg]


def _event(
    content: dict[str, Any], sender: str = "@alice:example.org", event_id: str = "$e1"
) -> dict[str, Any]:
    return {"type": "m.room.message", "sender": sender, "event_id": event_id, "content": content}


def test_a_direct_text_message_is_keyed_by_the_room() -> None:
    event = parse_message(_event({"msgtype": "m.text", "body": "hi"}), ROOM, BOT, SETTINGS, direct=True)
    assert event is not None
    assert (event.chat_id, event.sender_id, event.chat_type) == (ROOM, "@alice:example.org", ChatType.DIRECT)
    assert event.parts == (TextPart(text="hi"),)
    assert event.external_id == "event:$e1"
    assert event.session_key == "matrix:!room%3Aexample.org"


def test_a_thread_message_is_its_own_session_and_its_fallback_is_no_reply() -> None:
    relates = {
        "rel_type": "m.thread",
        "event_id": "$root",
        "is_falling_back": True,
        "m.in_reply_to": {"event_id": "$x"},
    }
    content = {"msgtype": "m.text", "body": "more", "m.relates_to": relates}
    event = parse_message(_event(content), ROOM, BOT, SETTINGS, direct=True)
    assert event is not None and event.thread_id == "$root"
    assert event.session_key == "matrix:!room%3Aexample.org:$root"
    assert not any(isinstance(p, ReplyToPart) for p in event.parts)


def test_own_events_edits_and_notices_are_never_answered() -> None:
    text = {"msgtype": "m.text", "body": "x"}
    assert parse_message(_event(text, sender=BOT), ROOM, BOT, SETTINGS, direct=True) is None
    edit = {**text, "m.relates_to": {"rel_type": "m.replace", "event_id": "$e0"}}
    assert parse_message(_event(edit), ROOM, BOT, SETTINGS, direct=True) is None
    notice = {"msgtype": "m.notice", "body": "I am a bot"}
    assert parse_message(_event(notice), ROOM, BOT, SETTINGS, direct=True) is None
    member = {"type": "m.room.member", "sender": "@a:b", "event_id": "$m", "content": {}}
    assert parse_message(member, ROOM, BOT, SETTINGS, direct=True) is None


def test_in_groups_only_mentions_are_answered_and_replies_quote() -> None:
    plain = _event({"msgtype": "m.text", "body": "chatting"})
    assert parse_message(plain, ROOM, BOT, SETTINGS, direct=False) is None
    content = {
        "msgtype": "m.text",
        "body": "> <@bob:example.org> earlier\n\ngate: what now?",
        "m.mentions": {"user_ids": [BOT]},
        "m.relates_to": {"m.in_reply_to": {"event_id": "$earlier"}},
    }
    event = parse_message(_event(content), ROOM, BOT, SETTINGS, direct=False)
    assert event is not None and event.chat_type is ChatType.GROUP
    assert event.parts == (
        ReplyToPart(message_id="$earlier"),
        MentionPart(user_id=BOT, is_self=True),
        TextPart(text="gate: what now?"),
    )
    assert event.metadata == {"reply_event_id": "$e1", "message_ref": "$e1", "reply_in_group": True}
    anyone = MatrixSettings(_env_file=None, require_mention_in_groups=False)  # type: ignore[call-arg]
    assert parse_message(plain, ROOM, BOT, anyone, direct=False) is not None


def test_media_messages_keep_their_mxc_uri() -> None:
    image = {
        "msgtype": "m.image",
        "body": "a.png",
        "url": "mxc://example.org/abc",
        "info": {"mimetype": "image/png"},
    }
    event = parse_message(_event(image), ROOM, BOT, SETTINGS, direct=True)
    assert event is not None and event.parts == (
        ImagePart(url="mxc://example.org/abc", mime_type="image/png"),
    )
    voice = {"msgtype": "m.audio", "body": "v.ogg", "url": "mxc://example.org/v", "info": {"size": 12}}
    event = parse_message(_event(voice), ROOM, BOT, SETTINGS, direct=True)
    assert event is not None and event.parts == (FilePart(url="mxc://example.org/v", name="v.ogg", size=12),)


def test_only_well_formed_mxc_uris_become_download_urls_on_the_homeserver() -> None:
    base = "https://hs.example.org/"
    assert media_url(base, "mxc://example.org/AbC_-1") == (
        "https://hs.example.org/_matrix/client/v1/media/download/example.org/AbC_-1"
    )
    for bad in ("https://evil.example/x", "mxc://example.org/../../admin", "mxc://a/b?c", "mxc://x@y/z", ""):
        assert media_url(base, bad) is None


def test_the_quoted_fallback_of_a_reply_is_stripped() -> None:
    assert strip_reply_fallback("> <@a:b> one\n> two\n\nanswer") == "answer"
    assert strip_reply_fallback("> not a fallback\nkept") == "> not a fallback\nkept"
