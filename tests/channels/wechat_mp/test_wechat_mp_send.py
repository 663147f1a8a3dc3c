"""The Official Account adapter's sending side against the fake WeChat API."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.errors import ChannelRateLimited, ChannelRejected, ChannelSendAuthError, ChannelUnavailable
from app.events import OutboundMessage, TextPart
from channels.wechat_mp import WeChatMpChannel
from tests.channels.support import send_only_context
from tests.channels.wechat_mp.test_wechat_mp import APP_ID, mp_settings
from tests.fakes.wechat_mp import FakeWeChatMpApi


@pytest.fixture
async def api() -> AsyncIterator[FakeWeChatMpApi]:
    async with FakeWeChatMpApi(app_id=APP_ID) as fake:
        yield fake


async def _channel(api: FakeWeChatMpApi, http: httpx.AsyncClient, **overrides: Any) -> WeChatMpChannel:
    channel = WeChatMpChannel(mp_settings(api, **overrides), send_only_context(http))
    await channel.start()
    return channel


def _reply(text: str) -> OutboundMessage:
    return OutboundMessage(channel="wechat-mp", chat_id="openid-1", parts=(TextPart(text=text),))


@pytest.mark.parametrize(
    ("errcode", "error"),
    [
        (45009, ChannelRateLimited),  # daily API quota
        (45011, ChannelRateLimited),  # per-minute frequency
        (-1, ChannelUnavailable),  # system busy
        (40164, ChannelSendAuthError),  # server IP not whitelisted
        (48001, ChannelSendAuthError),  # API not authorised for this account
        (45015, ChannelRejected),  # the user has not written for 48 hours
        (45047, ChannelRejected),  # the reply quota for the user's message is used up
        (40003, ChannelRejected),  # invalid OpenID
    ],
)
async def test_errcodes_become_typed_delivery_errors(
    api: FakeWeChatMpApi, errcode: int, error: type[Exception]
) -> None:
    api.send_errcode = errcode
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http, rate_limit_retry_seconds=9)
        with pytest.raises(error, match=str(errcode)) as caught:
            await channel.send(_reply("hi"))
    if isinstance(caught.value, ChannelRateLimited):
        assert caught.value.retry_after == 9


@pytest.mark.parametrize("endpoint", ["stable", "classic"])
async def test_wrong_secret_is_an_auth_error(api: FakeWeChatMpApi, endpoint: str) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http, app_secret="wrong", token_endpoint=endpoint)
        with pytest.raises(ChannelSendAuthError, match="40125"):
            await channel.send(_reply("hi"))


async def test_a_long_reply_is_split_and_capped_at_the_reply_quota(api: FakeWeChatMpApi) -> None:
    text = "段落。" * 3000  # 27,000 bytes: more than five 2048-byte messages
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http)
        await channel.send(_reply(text))
    pieces = [c.body["text"]["content"] for c in api.sent]
    assert len(pieces) == 5
    assert all(len(p.encode()) <= 2048 for p in pieces)
    assert pieces[-1].endswith("…")
    assert text.startswith("".join(pieces)[:-1])
