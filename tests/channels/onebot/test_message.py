"""CQ codes and segments ↔ parts, on the examples of the OneBot v11 message spec."""

from __future__ import annotations

from app.events import FilePart, ImagePart, MentionPart, ReplyToPart, TextPart
from channels.onebot.message import normalize, parse_cq_string, parts_to_segments, segments_to_parts


def test_cq_string_examples_from_the_spec() -> None:
    assert parse_cq_string("[CQ:face,id=178]看看我刚拍的照片[CQ:image,file=123.jpg]") == [
        {"type": "face", "data": {"id": "178"}},
        {"type": "text", "data": {"text": "看看我刚拍的照片"}},
        {"type": "image", "data": {"file": "123.jpg"}},
    ]
    # The first "=" splits name and value; "&#44;" inside a value is a comma.
    assert parse_cq_string("[CQ:share,title=标题中有=等号,url=http://baidu.com]") == [
        {"type": "share", "data": {"title": "标题中有=等号", "url": "http://baidu.com"}}
    ]
    assert parse_cq_string(
        "[CQ:share,title=震惊&#44;小伙睡觉前居然...,url=http://baidu.com/?a=1&amp;b=2]"
    ) == [{"type": "share", "data": {"title": "震惊,小伙睡觉前居然...", "url": "http://baidu.com/?a=1&b=2"}}]
    assert parse_cq_string("- &#91;x&#93; 使用 `&amp;data` 获取地址") == [
        {"type": "text", "data": {"text": "- [x] 使用 `&data` 获取地址"}}
    ]
    assert parse_cq_string("[CQ:shake]") == [{"type": "shake", "data": {}}]


def test_segments_become_parts() -> None:
    segments = normalize(
        [
            {"type": "reply", "data": {"id": "77"}},
            {"type": "at", "data": {"qq": "10001"}},
            {"type": "text", "data": {"text": " hi "}},
            {"type": "face", "data": {"id": "178"}},
            {"type": "at", "data": {"qq": "all"}},
            {"type": "image", "data": {"file": "a.jpg", "url": "https://img.example/a.jpg"}},
            {"type": "record", "data": {"file": "v.amr", "url": "https://img.example/v.amr"}},
            {"type": "json", "data": {"data": "{}"}},
        ]
    )
    parsed = segments_to_parts(segments, "10001")
    assert parsed.mentions_self
    assert parsed.reply_to == "77"
    assert parsed.parts == (
        ReplyToPart(message_id="77"),
        MentionPart(user_id="10001", is_self=True),
        TextPart(text="hi [face:178]"),
        MentionPart(user_id="all"),
        ImagePart(url="https://img.example/a.jpg"),
        FilePart(url="https://img.example/v.amr", name="v.amr", mime_type="audio/amr"),
    )
    assert not segments_to_parts(normalize("[CQ:at,qq=10001]"), "10001").has_content


def test_parts_become_segments() -> None:
    parts = (
        TextPart(text="smile [face:14] [CQ:at,qq=all]"),
        ImagePart(url="https://img.example/b.png"),
        ImagePart(data_base64="aGk="),
        MentionPart(user_id="42"),
        ReplyToPart(message_id="9"),
    )
    assert parts_to_segments(parts) == [
        {"type": "reply", "data": {"id": "9"}},
        {"type": "text", "data": {"text": "smile "}},
        {"type": "face", "data": {"id": "14"}},
        {"type": "text", "data": {"text": " [CQ:at,qq=all]"}},  # stays text: sent as an array
        {"type": "image", "data": {"file": "https://img.example/b.png"}},
        {"type": "image", "data": {"file": "base64://aGk="}},
        {"type": "at", "data": {"qq": "42"}},
    ]
