"""`download_capped` against a real local server that streams without `Content-Length`,
and `inline_media`'s rules (images as data, failed fetches kept as references)."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from aiohttp import web

from app.events import FilePart, ImagePart, InboundEvent, TextPart
from app.fetch import FetchRefused, GuardedFetcher
from channels.common.media import Media, MediaTooLarge, download_capped, inline_media
from tests.fakes.local_server import LocalServer


class ChunkedServer(LocalServer):
    """`GET /<n>` streams n bytes in 1 KB chunks, with no Content-Length; `/moved` redirects."""

    async def _bytes(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "image/gif"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        left = int(request.match_info["n"])
        while left > 0:
            await resp.write(b"x" * min(1024, left))
            left -= 1024
        await resp.write_eof()
        return resp

    async def _moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/10")

    async def __aenter__(self) -> ChunkedServer:
        app = web.Application()
        app.router.add_get("/moved", self._moved)
        app.router.add_get("/{n}", self._bytes)
        await self._serve(app)
        return self


@pytest.fixture
async def server() -> AsyncIterator[ChunkedServer]:
    async with ChunkedServer() as srv:
        yield srv


async def test_download_stops_at_the_limit_without_a_content_length(server: ChunkedServer) -> None:
    fetcher = GuardedFetcher(allow_private_hosts=["127.0.0.1"])  # the local server, named by the operator
    media = await download_capped(fetcher, f"{server.url}/3000", 3000)
    assert (len(media.data), media.content_type) == (3000, "image/gif")
    with pytest.raises(MediaTooLarge):
        await download_capped(fetcher, f"{server.url}/50000", 3000)
    assert (await download_capped(fetcher, f"{server.url}/moved", 100)).data == b"x" * 10


async def test_a_url_on_a_private_address_is_not_downloaded_unless_under_a_trusted_base(
    server: ChunkedServer,
) -> None:
    with pytest.raises(FetchRefused):
        await download_capped(GuardedFetcher(), f"{server.url}/10", 100)
    media = await download_capped(GuardedFetcher(), f"{server.url}/10", 100, trusted=[server.url])
    assert media.data == b"x" * 10


async def test_images_become_data_and_failed_fetches_keep_their_reference() -> None:
    event = InboundEvent(
        channel="test",
        chat_id="c",
        sender_id="s",
        parts=(
            TextPart(text="look"),
            ImagePart(url="https://cdn.example/ok.png"),
            ImagePart(url="https://cdn.example/broken.png"),
            FilePart(url="https://cdn.example/voice.amr", mime_type="audio/amr"),  # no STT: untouched
        ),
    )

    async def fetch(part: Any) -> Media | None:
        if part.url.endswith("broken.png"):
            raise httpx.ConnectError("refused")
        return Media(b"PNG", "image/png")

    result = await inline_media(event, fetch, transcribe=None, channel="test")
    text, ok, broken, voice = result.parts
    assert ok == ImagePart(data_base64=base64.b64encode(b"PNG").decode(), mime_type="image/png")
    assert (text, broken, voice) == event.parts[:1] + event.parts[2:]


async def test_a_refused_image_link_becomes_text_and_a_refused_file_stays_a_reference() -> None:
    """A refused image must not stay an image part: its URL would go to the model endpoint
    as an `image_url`, for a self-hosted model server to fetch from inside the network."""
    event = InboundEvent(
        channel="test",
        chat_id="c",
        sender_id="s",
        parts=(
            ImagePart(url="http://127.0.0.1:9/secret"),
            FilePart(url="http://10.0.0.1/f.pdf", name="f.pdf"),
        ),
    )

    async def fetch(part: Any) -> Media | None:
        raise FetchRefused(f"{part.url} is private")

    result = await inline_media(event, fetch, transcribe=None, channel="test", files=True)
    note, file = result.parts
    assert note == TextPart(
        text="[an image link that was not fetched (a private address): http://127.0.0.1:9/secret]"
    )
    assert file == event.parts[1]
