"""iLink messages → events, and the CDN keys' two encodings (Tencent's cdn/pic-decrypt.ts)."""

from __future__ import annotations

import base64
import os

import pytest

from app.events import ChatType, FilePart, ImagePart, ReplyToPart, TextPart
from channels.weixin.cdn import MediaKeyError, decrypt, download_url, encrypt, media_key, padded_size
from channels.weixin.parse import MediaRef, parse_message
from tests.channels.weixin.support import WX_SETTINGS
from tests.fakes import weixin as wx


def test_a_text_message_becomes_a_direct_event_with_its_token() -> None:
    parsed = parse_message(wx.text_message("hi", message_id=wx.FIRST_ID, context_token="ctx-9"), WX_SETTINGS)
    event = parsed.event
    assert event is not None
    assert (event.chat_id, event.sender_id, event.chat_type) == (
        "alice@im.wechat",
        "alice@im.wechat",
        ChatType.DIRECT,
    )
    assert event.external_id == f"msg:{wx.FIRST_ID}"
    assert event.parts == (TextPart(text="hi"),)
    assert event.metadata["reply_context_token"] == parsed.context_token == "ctx-9"
    assert event.session_key == "weixin:alice@im.wechat"


def test_the_bots_own_messages_and_empty_ones_are_ignored() -> None:
    own = {**wx.text_message("echo", message_id=1), "message_type": 2}
    assert parse_message(own, WX_SETTINGS).ignored == "the bot's own message"
    assert parse_message(wx.text_message("", message_id=2, items=[]), WX_SETTINGS).event is None
    assert parse_message("nonsense", WX_SETTINGS).event is None


def test_media_items_become_parts_with_their_cdn_references_aside() -> None:
    items = [
        {"type": 1, "text_item": {"text": "see"}, "ref_msg": {"svr_id": "555", "title": "quoted"}},
        {
            "type": 2,
            "image_item": {"aeskey": "00" * 16, "media": {"encrypt_query_param": "p1", "aes_key": "x"}},
        },
        {"type": 3, "voice_item": {"text": "transcribed by WeChat", "media": {"encrypt_query_param": "p2"}}},
        {"type": 4, "file_item": {"file_name": "a.pdf", "len": "42", "media": {"encrypt_query_param": "p3"}}},
        {
            "type": 5,
            "video_item": {"media": {"encrypt_query_param": "p4", "full_url": "https://evil.example/x"}},
        },
    ]
    parsed = parse_message(wx.text_message("", message_id=3, items=items, group_id="g@chatroom"), WX_SETTINGS)
    event = parsed.event
    assert event is not None and event.chat_type is ChatType.GROUP and event.chat_id == "g@chatroom"
    assert event.parts == (
        ReplyToPart(message_id="555"),
        TextPart(text="see"),
        ImagePart(url="weixin-media:0"),
        TextPart(text="transcribed by WeChat"),
        FilePart(url="weixin-media:1", name="a.pdf", size=42),
        FilePart(url="weixin-media:2", name="video.mp4", mime_type="video/mp4"),
    )
    assert parsed.media["weixin-media:0"].aes_key_hex == "00" * 16
    assert "aes_key" not in str(event.model_dump())  # keys are never stored with the event
    # A URL in the payload is not followed outside the operator's CDN base.
    cdn = "https://novac2c.cdn.weixin.qq.com/c2c"
    assert download_url(parsed.media["weixin-media:2"], cdn) == f"{cdn}/download?encrypted_query_param=p4"
    inside = MediaRef(kind=5, encrypt_query_param="p", aes_key=None, full_url=f"{cdn}/download?x=1")
    assert download_url(inside, cdn) == f"{cdn}/download?x=1"


def test_both_key_encodings_and_the_round_trip() -> None:
    key = os.urandom(16)
    raw = MediaRef(kind=2, encrypt_query_param="p", aes_key=base64.b64encode(key).decode())
    hexed = MediaRef(kind=4, encrypt_query_param="p", aes_key=base64.b64encode(key.hex().encode()).decode())
    assert media_key(raw) == media_key(hexed) == key
    with pytest.raises(MediaKeyError):
        media_key(MediaRef(kind=4, encrypt_query_param="p", aes_key=base64.b64encode(b"short").decode()))
    data = os.urandom(33)
    sealed = encrypt(data, key)
    assert len(sealed) == padded_size(len(data)) == 48
    assert decrypt(sealed, key) == data
