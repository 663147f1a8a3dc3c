"""Answers with media: images by their https URL, other files as links, data-only media noted."""

from __future__ import annotations

import base64
import time
from collections.abc import Sequence
from typing import Any

import httpx

from app.channel import AcceptResult, ChannelContext, WaitResult
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage, TextPart
from channels.line.adapter import LineChannel
from channels.line.settings import LineSettings
from tests.fakes.line import ACCESS_TOKEN, SECRET, FakeLine

USER = "U4af4980629a0b1c2d3e4f5a6b7c8d9e0"


async def _accept(events: Sequence[InboundEvent]) -> list[AcceptResult]:
    raise AssertionError("nothing is received here")


async def _wait(event_id: str, timeout: float) -> WaitResult:
    raise AssertionError("nothing is waited for here")


def _channel(fake: FakeLine, http: httpx.AsyncClient, **values: Any) -> LineChannel:
    settings = LineSettings(  # type: ignore[call-arg]
        _env_file=None,
        channel_secret=SECRET,
        channel_access_token=ACCESS_TOKEN,
        api_base_url=fake.url,
        **values,
    )
    return LineChannel(settings, ChannelContext(accept=_accept, wait_for_replies=_wait, http=http))


async def test_the_loading_animation_is_shown_once_per_period_and_only_to_users() -> None:
    async with FakeLine() as fake, httpx.AsyncClient(timeout=30) as http:
        channel = _channel(fake, http, loading_seconds=30)
        streamer = channel.streamer()
        assert streamer is not None
        to_user = OutboundMessage(channel="line", chat_id=USER, parts=(), metadata={"reply_source": "user"})
        to_group = OutboundMessage(
            channel="line", chat_id="Cgroup", parts=(), metadata={"reply_source": "group"}
        )
        try:
            for _ in range(3):  # the hub asks every few seconds; one animation lasts 30
                await streamer.typing(to_user)
            await streamer.typing(to_group)
        finally:
            await channel.stop()
    assert fake.loading == [{"chatId": USER, "loadingSeconds": 30}]
    assert _channel(fake, http, streaming="off").streamer() is None


async def test_an_answer_with_media_sends_images_links_and_a_note() -> None:
    async with FakeLine() as fake, httpx.AsyncClient(timeout=30) as http:
        settings = LineSettings(  # type: ignore[call-arg]
            _env_file=None, channel_secret=SECRET, channel_access_token=ACCESS_TOKEN, api_base_url=fake.url
        )
        channel = LineChannel(settings, ChannelContext(accept=_accept, wait_for_replies=_wait, http=http))
        token = fake.reply_token()
        message = OutboundMessage(
            channel="line",
            chat_id=USER,
            parts=(
                TextPart(text="Here it is."),
                ImagePart(url="https://cdn.example/chart.png"),
                FilePart(url="https://cdn.example/report.pdf", name="report.pdf"),
                ImagePart(data_base64=base64.b64encode(b"png").decode(), mime_type="image/png"),
            ),
            metadata={"reply_token": token, "reply_token_at": time.time(), "reply_quote_token": "q1"},
        )
        try:
            await channel.send(message)
        finally:
            await channel.stop()
    [sent] = fake.sent
    assert sent.path == "/v2/bot/message/reply"
    assert sent.body["messages"] == [
        {"type": "text", "text": "Here it is.", "quoteToken": "q1"},
        {
            "type": "image",
            "originalContentUrl": "https://cdn.example/chart.png",
            "previewImageUrl": "https://cdn.example/chart.png",
        },
        {"type": "text", "text": "https://cdn.example/report.pdf"},
        {
            "type": "text",
            "text": "(A file could not be sent here: LINE only takes media from a public https address.)",
        },
    ]
