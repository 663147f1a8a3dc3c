"""`im.message.receive_v1` payloads → events: message types, mentions, threads, what is ignored."""

from __future__ import annotations

from typing import Any

import pytest

from app.errors import InvalidPayload
from app.events import ChatType, FilePart, ImagePart, MentionPart, ReplyToPart, TextPart
from channels.feishu import FeishuSettings
from channels.feishu.parse import parse_message_event
from tests.fakes import feishu as fs

BOT = fs.BOT_OPEN_ID


def settings(**values: Any) -> FeishuSettings:
    return FeishuSettings(_env_file=None, api_base="https://open.larksuite.com/", **values)  # type: ignore[call-arg]


def test_text_in_a_direct_chat() -> None:
    event = parse_message_event(fs.text_event("hi", event_id="ev1", message_id="om_1"), settings(), BOT).event
    assert event is not None
    assert (event.chat_id, event.sender_id, event.chat_type) == ("oc_alice", "ou_alice", ChatType.DIRECT)
    assert event.parts == (TextPart(text="hi"),)
    assert event.external_id == "ev1"
    assert event.session_key == "feishu:oc_alice"
    assert event.metadata["feishu_message_id"] == "om_1"
    assert "reply_feishu_message_id" not in event.metadata  # a direct chat is answered in the chat


def test_rich_text_with_a_locale_links_mentions_and_images() -> None:
    post = {
        "en_us": {
            "title": "Report",
            "content": [
                [
                    {"tag": "at", "user_id": "@_user_1"},
                    {"tag": "text", "text": " please read "},
                    {"tag": "a", "text": "this", "href": "https://example.com"},
                    {"tag": "at", "user_id": "@_user_2"},
                ],
                [{"tag": "img", "image_key": "img_1"}, {"tag": "media", "file_key": "file_9"}],
                [{"tag": "code_block", "language": "PYTHON", "text": "print(1)"}],
            ],
        }
    }
    mentions = [fs.bot_mention("@_user_1"), fs.bot_mention("@_user_2", open_id="ou_bob", name="Bob")]
    payload = fs.message_event("post", post, chat_type="group", chat_id="oc_g", mentions=mentions)
    event = parse_message_event(payload, settings(), BOT).event
    assert event is not None
    text, image, media, mention = event.parts
    assert text == TextPart(text="Report\nplease read this (https://example.com)@Bob\nprint(1)")
    assert isinstance(image, ImagePart)
    assert image.url == (
        f"https://open.larksuite.com/open-apis/im/v1/messages/{payload['event']['message']['message_id']}"
        "/resources/img_1?type=image"
    )
    assert isinstance(media, FilePart) and media.url and media.url.endswith("/resources/file_9?type=file")
    assert mention == MentionPart(user_id=BOT, is_self=True)


def test_images_files_and_replies() -> None:
    image = parse_message_event(fs.message_event("image", {"image_key": "img_2"}), settings(), BOT).event
    assert image is not None and [p.type for p in image.parts] == ["image"]
    payload = fs.message_event("file", {"file_key": "file_2", "file_name": "a.pdf"}, parent_id="om_prev")
    file = parse_message_event(payload, settings(), BOT).event
    assert file is not None
    assert isinstance(file.parts[0], FilePart) and file.parts[0].name == "a.pdf"
    assert file.parts[1] == ReplyToPart(message_id="om_prev")


def test_mention_placeholders_are_replaced_longest_first() -> None:
    mentions = [fs.bot_mention(f"@_user_{i}", open_id=f"ou_{i}", name=f"P{i}") for i in range(1, 11)]
    mentions.append(fs.bot_mention("@_user_11"))
    text = "@_user_11 @_user_1 and @_user_10"
    payload = fs.text_event(text, chat_type="group", mentions=mentions)
    event = parse_message_event(payload, settings(), BOT).event
    assert event is not None and event.text == "@P1 and @P10"


def test_without_the_bots_open_id_any_mention_counts() -> None:
    payload = fs.text_event("@_user_1 hi", chat_type="group", mentions=[fs.bot_mention(open_id="ou_x")])
    assert parse_message_event(payload, settings(), None).event is not None
    assert parse_message_event(payload, settings(), BOT).ignored


def test_threads_and_the_thread_scope() -> None:
    thread = settings(session_scope="thread")
    reply = fs.group_mention("x", root_id="om_root", thread_id="omt_1", message_id="om_c")
    event = parse_message_event(reply, thread, BOT).event
    assert event is not None
    assert event.thread_id == "om_root"
    assert event.session_key == "feishu:oc_team:om_root"
    assert event.metadata["reply_feishu_message_id"] == "om_c"
    assert event.metadata["reply_feishu_in_thread"] is True
    assert event.metadata["feishu_thread_id"] == "omt_1"
    top = parse_message_event(fs.group_mention("y", message_id="om_top"), thread, BOT).event
    assert top is not None and top.session_key == "feishu:oc_team"
    assert top.metadata["reply_feishu_in_thread"] is False
    # user_in_chat: each member of a group their own session.
    per_user = parse_message_event(fs.group_mention("z"), settings(session_scope="user_in_chat"), BOT).event
    assert per_user is not None and per_user.session_key == "feishu:oc_team:user:ou_alice"


@pytest.mark.parametrize(
    "payload",
    [
        fs.message_event("sticker", {"file_key": "s"}),
        fs.message_event("text", {"text": "   "}),
        fs.message_event("image", {}),
    ],
)
def test_messages_with_nothing_to_answer_are_ignored(payload: dict[str, Any]) -> None:
    assert parse_message_event(payload, settings(), BOT).ignored


def test_malformed_payloads_are_refused() -> None:
    good = fs.text_event("x")
    no_sender = {**good, "event": {"message": good["event"]["message"]}}
    bad_content = fs.text_event("x")
    bad_content["event"]["message"]["content"] = "{not json"
    no_event_id = fs.text_event("x")
    del no_event_id["header"]["event_id"]
    for payload in (no_sender, bad_content, no_event_id, {"schema": "2.0", "header": {}}):
        with pytest.raises(InvalidPayload):
            parse_message_event(payload, settings(), BOT)
