"""Typing while a turn runs, and CDN media both ways (AES-128-ECB) against the fake."""

from __future__ import annotations

import array
import base64
import hashlib
import io
import math
import os
import wave
from pathlib import Path

import httpx
import pysilk
import pytest
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from sqlalchemy import select

from app.db.models import inbox
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from channels.weixin import WeixinChannel, voice
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count, send_only_context, wait_outbox_final
from tests.channels.weixin.support import wx_settings
from tests.conftest import ServeApp
from tests.fakes import weixin as wx
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.weixin import FakeILink

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(300)


def _ecb(key: bytes) -> Cipher[modes.ECB]:
    return Cipher(algorithms.AES(key), modes.ECB())


def encrypt(data: bytes, key: bytes) -> bytes:
    """AES-128-ECB with PKCS#7, as the WeChat CDN stores media (Tencent's cdn/aes-ecb.ts)."""
    padder = padding.PKCS7(128).padder()
    enc = _ecb(key).encryptor()
    return enc.update(padder.update(data) + padder.finalize()) + enc.finalize()


def decrypt(data: bytes, key: bytes) -> bytes:
    dec = _ecb(key).decryptor()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(dec.update(data) + dec.finalize()) + unpadder.finalize()


async def _stored_parts(runtime: object) -> list[dict[str, object]]:
    async with runtime.engine.connect() as conn:  # type: ignore[attr-defined]
        payloads = [r[0] for r in await conn.execute(select(inbox.c.payload).order_by(inbox.c.id))]
    return [part for p in payloads for part in p["parts"]]


async def test_typing_is_shown_while_the_turn_runs(serve: ServeApp) -> None:
    async with FakeILink() as fake:
        msg = await fake.push(wx.text_message("think about it"))
        # A slow model: the turn runs long enough for the typing state.
        async with serve(channel_settings={"weixin": wx_settings(fake)}, offline_latency_ms=1500) as srv:
            await wait_outbox_final(srv.runtime, 1)
            await fake.wait_for("sendtyping", 2)
    [config] = fake.calls_of("getconfig")
    assert config.body["ilink_user_id"] == "alice@im.wechat"
    assert config.body["context_token"] == msg["context_token"]
    typing = [c.body for c in fake.calls_of("sendtyping")]
    assert typing[0] == {
        "ilink_user_id": "alice@im.wechat",
        "typing_ticket": "ticket-alice@im.wechat",
        "status": 1,
        "base_info": typing[0]["base_info"],
    }
    assert typing[-1]["status"] == 2  # cancelled once the answer went out
    send_at = fake.calls.index(fake.calls_of("sendmessage")[0])
    assert fake.calls.index(fake.calls_of("sendtyping")[0]) < send_at


async def test_images_are_downloaded_from_the_cdn_and_decrypted(serve: ServeApp) -> None:
    raw_key, hex_key = os.urandom(16), os.urandom(16)
    async with FakeILink() as fake:
        fake.put_cdn("img-raw", encrypt(PNG, raw_key))
        fake.put_cdn("img-hex", encrypt(PNG[::-1], hex_key))
        items = [
            {"type": 1, "text_item": {"text": "look"}},
            # images' media.aes_key: base64 of the 16 raw bytes
            {
                "type": 2,
                "image_item": {
                    "media": {"encrypt_query_param": "img-raw", "aes_key": base64.b64encode(raw_key).decode()}
                },
            },
            # image_item.aeskey (hex) wins over media.aes_key
            {
                "type": 2,
                "image_item": {
                    "aeskey": hex_key.hex(),
                    "media": {
                        "encrypt_query_param": "img-hex",
                        "aes_key": base64.b64encode(raw_key).decode(),
                    },
                },
            },
        ]
        await fake.push(wx.text_message("", items=items))
        async with serve(channel_settings={"weixin": wx_settings(fake)}) as srv:
            await wait_outbox_final(srv.runtime, 1)
            parts = await _stored_parts(srv.runtime)
    images = [p for p in parts if p["type"] == "image"]
    assert [base64.b64decode(str(p["data_base64"])) for p in images] == [PNG, PNG[::-1]]
    assert sorted(fake.downloads) == ["img-hex", "img-raw"]


async def test_an_image_over_the_limit_is_refused_politely_and_not_stored(serve: ServeApp) -> None:
    key = os.urandom(16)
    async with FakeILink() as fake:
        fake.put_cdn("big", encrypt(os.urandom(5000), key))
        item = {
            "type": 2,
            "image_item": {
                "media": {"encrypt_query_param": "big", "aes_key": base64.b64encode(key).decode()}
            },
        }
        await fake.push(wx.text_message("", items=[item]))
        await fake.push(wx.text_message("then text"))
        settings = wx_settings(fake, media_max_bytes=1000)
        async with serve(channel_settings={"weixin": settings}) as srv:
            await wait_outbox_final(srv.runtime, 1)
            await fake.wait_until(lambda: len(fake.sent()) >= 2)
            assert await count(srv.runtime, inbox) == 1
    assert "too large" in fake.sent_texts()[0]
    assert fake.sent_texts()[1] == "You said: then text"


async def test_images_and_files_out_are_encrypted_and_uploaded() -> None:
    doc = b"%PDF-1.4 " + os.urandom(100)
    async with FakeILink() as fake, httpx.AsyncClient(timeout=30) as http:
        channel = WeixinChannel(wx_settings(fake), send_only_context(http))
        try:
            message = OutboundMessage(
                channel="weixin",
                chat_id="alice@im.wechat",
                parts=(
                    TextPart(text="here"),
                    ImagePart(data_base64=base64.b64encode(PNG).decode(), mime_type="image/png"),
                    FilePart(
                        data_base64=base64.b64encode(doc).decode(), name="a.pdf", mime_type="application/pdf"
                    ),
                ),
                metadata={"reply_context_token": "ctx-1"},
            )
            await channel.send(message)
        finally:
            await channel.stop()
    text, image, file = (m["item_list"][0] for m in fake.sent())
    assert text == {"type": 1, "text_item": {"text": "here"}}
    assert all(m["context_token"] == "ctx-1" for m in fake.sent())
    uploads = [c.body for c in fake.calls_of("getuploadurl")]
    assert [u["media_type"] for u in uploads] == [1, 3]
    for up, data, item in ((uploads[0], PNG, image["image_item"]), (uploads[1], doc, file["file_item"])):
        assert up["rawsize"] == len(data) and up["rawfilemd5"] == hashlib.md5(data).hexdigest()
        assert up["filesize"] == (len(data) // 16 + 1) * 16 and up["no_need_thumb"] is True
        media = item["media"]
        assert media["encrypt_query_param"] == f"dl-{up['filekey']}"
        # aes_key: base64 of the key's hex, as Tencent's client sends it
        key = bytes.fromhex(base64.b64decode(media["aes_key"]).decode())
        assert key.hex() == up["aeskey"]
        assert decrypt(fake.cdn[media["encrypt_query_param"]], key) == data
    assert image["image_item"]["mid_size"] == uploads[0]["filesize"]
    assert file["file_item"]["file_name"] == "a.pdf" and file["file_item"]["len"] == str(len(doc))


def _wav(seconds: float, rate: int, channels: int = 1) -> bytes:
    """A 440 Hz tone as 16-bit PCM WAV."""
    frames = array.array(
        "h",
        (
            int(8000 * math.sin(2 * math.pi * 440 * i / rate))
            for i in range(int(seconds * rate))
            for _ in range(channels)
        ),
    )
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(frames.tobytes())
    return out.getvalue()


def _silk_pcm(silk: bytes, rate: int = 24_000) -> bytes:
    """SILK decoded by the library's own decoder, as a WeChat client plays it."""
    out = io.BytesIO()
    pysilk.decode(io.BytesIO(silk), out, rate)
    return out.getvalue()


async def test_audio_out_is_a_silk_voice_note() -> None:
    tone = _wav(1.5, 16_000, channels=2)
    mp3 = b"ID3" + os.urandom(200)
    async with FakeILink() as fake, httpx.AsyncClient(timeout=30) as http:
        channel = WeixinChannel(wx_settings(fake), send_only_context(http))
        try:
            message = OutboundMessage(
                channel="weixin",
                chat_id="alice@im.wechat",
                parts=(
                    FilePart(
                        data_base64=base64.b64encode(tone).decode(), name="answer.wav", mime_type="audio/wav"
                    ),
                    # No decoder for MP3 here: it goes out as a file, never as a broken voice note.
                    FilePart(
                        data_base64=base64.b64encode(mp3).decode(), name="a.mp3", mime_type="audio/mpeg"
                    ),
                ),
                metadata={"reply_context_token": "ctx-1"},
            )
            await channel.send(message)
        finally:
            await channel.stop()
    note, file = (m["item_list"][0] for m in fake.sent())
    uploads = [c.body for c in fake.calls_of("getuploadurl")]
    assert [u["media_type"] for u in uploads] == [4, 3]  # UploadMediaType.VOICE, FILE
    assert note["type"] == 3  # MessageItemType.VOICE
    item = note["voice_item"]
    assert (item["encode_type"], item["sample_rate"], item["bits_per_sample"]) == (6, 24_000, 16)
    assert item["playtime"] == 1500
    key = bytes.fromhex(base64.b64decode(item["media"]["aes_key"]).decode())
    silk = decrypt(fake.cdn[item["media"]["encrypt_query_param"]], key)
    assert silk.startswith(b"\x02#!SILK_V3")  # WeChat's form of SILK v3
    assert uploads[0]["rawsize"] == len(silk) and uploads[0]["rawfilemd5"] == hashlib.md5(silk).hexdigest()
    pcm = _silk_pcm(silk)
    assert len(pcm) == 2 * 24_000 * 1.5  # 1.5 s of 16-bit mono at 24 kHz
    samples = array.array("h", pcm)
    assert max(samples) > 2000  # the tone, not silence
    assert file["type"] == 4 and file["file_item"]["file_name"] == "a.mp3"


async def test_silk_audio_out_is_sent_as_it_is() -> None:
    silk = io.BytesIO()
    pcm = array.array("h", _wav(0.6, 24_000)[44:]).tobytes()  # the WAV's samples, header skipped
    pysilk.encode(io.BytesIO(pcm), silk, 24_000, 24_000, tencent=True)
    async with FakeILink() as fake, httpx.AsyncClient(timeout=30) as http:
        channel = WeixinChannel(wx_settings(fake), send_only_context(http))
        try:
            part = FilePart(data_base64=base64.b64encode(silk.getvalue()).decode(), mime_type="audio/silk")
            await channel.send(OutboundMessage(channel="weixin", chat_id="alice@im.wechat", parts=(part,)))
        finally:
            await channel.stop()
    [msg] = fake.sent()
    item = msg["item_list"][0]["voice_item"]
    key = bytes.fromhex(base64.b64decode(item["media"]["aes_key"]).decode())
    assert decrypt(fake.cdn[item["media"]["encrypt_query_param"]], key) == silk.getvalue()
    assert item["playtime"] == 600


async def test_an_answer_with_audio_reaches_wechat_as_a_voice_note(serve: ServeApp, tmp_path: Path) -> None:
    """The whole way: the model attaches a WAV of its workspace (`send_file`), the answer
    goes out as text and a voice note."""
    (tmp_path / "answer.wav").write_bytes(_wav(0.8, 24_000))
    async with FakeILink() as fake, FakeOpenAI() as model:
        model.enqueue(calls(ToolCall("send_file", {"path": "answer.wav"})), text("Listen."))
        await fake.push(wx.text_message("say it"))
        settings = openai_settings(model, workspace_root=str(tmp_path))
        async with serve(channel_settings={"weixin": wx_settings(fake)}, **settings) as srv:
            await wait_outbox_final(srv.runtime, 1)
            await fake.wait_until(lambda: len(fake.sent()) >= 2)
    words, note = (m["item_list"][0] for m in fake.sent())
    assert words == {"type": 1, "text_item": {"text": "Listen."}}
    item = note["voice_item"]
    assert note["type"] == 3 and item["playtime"] == 800
    key = bytes.fromhex(base64.b64decode(item["media"]["aes_key"]).decode())
    assert len(_silk_pcm(decrypt(fake.cdn[item["media"]["encrypt_query_param"]], key))) == 2 * 24_000 * 0.8


def test_audio_a_voice_note_cannot_carry_stays_a_file() -> None:
    with pytest.raises(voice.NotVoice, match="60 s"):
        voice.to_voice(_wav(61, 8_000), "audio/wav", "long.wav")
    with pytest.raises(voice.NotVoice, match="8-bit"):
        out = io.BytesIO()
        with wave.open(out, "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(1)
            wav.setframerate(8_000)
            wav.writeframes(bytes(800))
        voice.to_voice(out.getvalue(), "audio/wav", "a.wav")
    assert not voice.can_voice("audio/mpeg", "a.mp3")
