"""SSRF through OneBot media, through the real server and a fake bridge: segment URLs
that aim at loopback, private, link-local, IPv6, mapped or numeric-spelled addresses, and
redirects to each from a host the operator allowed, reach a counting server 0 times; no
bytes are saved in the sender's workspace; a gzip bomb gets the polite "too large" reply
and nothing is stored (its memory bound: tests/app/test_fetch.py).

The counting server listens on 127.0.0.1, 127.0.0.2 and ::1 at one port, so every
loopback spelling would land on it if fetched; the operator names only 127.0.0.2
(`MEDIA_ALLOW_PRIVATE_HOSTS`), the "bridge on the LAN" whose redirects are judged too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.db.models import inbox
from tests.app.test_fetch import ssrf_urls
from tests.channels.onebot.test_onebot import BOT, TOKEN, onebot_settings, ws_url
from tests.channels.support import count, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.counting_server import BODY, CountingServer, gzip_bomb
from tests.fakes.onebot import FakeBridge, private_message

ALLOWED = "127.0.0.2"


def _image(url: str) -> dict[str, Any]:
    return {"type": "image", "data": {"file": "x.png", "url": url}}


def _file(name: str, url: str) -> dict[str, Any]:
    return {"type": "file", "data": {"file": name, "file_id": f"id-{name}", "file_size": "15", "url": url}}


def _saved(root: Path) -> list[Path]:
    return sorted(root.rglob("inbox/*"))


async def test_ssrf_segment_urls_and_redirects_to_them_are_never_fetched(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with CountingServer() as target:
        urls = ssrf_urls(target.port)
        hop = target.url(ALLOWED, "/hop")
        message = [{"type": "text", "data": {"text": "look at these"}}]
        message += [_image(url) for url in urls]  # images are always downloaded
        message += [_file(f"r{i}.bin", f"{hop}?to={url}") for i, url in enumerate(urls)]  # kept files
        message += [_file("control.bin", target.url(ALLOWED))]  # the allowed host itself: fetched
        async with (
            serve(
                channel_settings={"onebot": onebot_settings()},
                media_allow_private_hosts=[ALLOWED],
                workspace_root=str(tmp_path),
                workspace_per_session=True,
            ) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            await bridge.send_event(private_message(BOT, 601, message))
            await wait_outbox_final(srv.runtime, timeout=60)  # a broken guard would wait on connects
            async with srv.runtime.engine.connect() as conn:
                [payload] = (await conn.execute(select(inbox.c.payload))).scalars().all()
    assert len(urls) == 20
    # 20 redirects answered by the allowed host and the control: not one hit elsewhere.
    assert target.hits_on(ALLOWED) == 21
    assert len(target.hits) == 21
    # No image part is left whose URL a model server could fetch: each is named in text.
    assert [p for p in payload["parts"] if p["type"] == "image"] == []
    notes = [p["text"] for p in payload["parts"] if p["type"] == "text"][1:]
    assert notes == [f"[an image link that was not fetched (a private address): {url}]" for url in urls]
    assert [p.read_bytes() for p in _saved(tmp_path)] == [BODY]  # only the control was saved
    assert _saved(tmp_path)[0].name.endswith("control.bin")


async def test_a_gzip_bomb_gets_the_polite_reply_and_nothing_is_stored(serve: ServeApp) -> None:
    async with CountingServer() as target:
        target.bomb = gzip_bomb(200 * 1024 * 1024)
        async with (
            serve(channel_settings={"onebot": onebot_settings()}, media_allow_private_hosts=[ALLOWED]) as srv,
            FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        ):
            await bridge.send_event(private_message(BOT, 602, [_image(target.url(ALLOWED, "/bomb"))]))
            [action] = await bridge.wait_for_actions(1)
            assert await count(srv.runtime, inbox) == 0
    assert [path for _, path, _ in target.hits] == ["/bomb"]
    assert (action.action, action.params["user_id"]) == ("send_private_msg", 602)
    assert "too large" in action.params["message"][0]["data"]["text"]
