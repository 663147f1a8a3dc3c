"""The WeCom adapter's sending side against the fake WeCom API: errcodes become the
core's typed delivery errors, split messages resume where they stopped, app chats."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.errors import ChannelRateLimited, ChannelRejected, ChannelSendAuthError, ChannelUnavailable
from app.events import OutboundMessage, TextPart
from channels.wecom import WeComChannel
from tests.channels.support import send_only_context
from tests.channels.wecom.test_wecom import CORP_ID, wecom_settings
from tests.fakes.wecom import FakeWeComApi


@pytest.fixture
async def api() -> AsyncIterator[FakeWeComApi]:
    async with FakeWeComApi(corp_id=CORP_ID) as fake:
        yield fake


async def _channel(api: FakeWeComApi, http: httpx.AsyncClient, **overrides: Any) -> WeComChannel:
    channel = WeComChannel(wecom_settings(api, **overrides), send_only_context(http))
    await channel.start()
    return channel


def _reply(text: str, chat_id: str = "zhangsan", message_id: str = "out-1") -> OutboundMessage:
    return OutboundMessage(
        message_id=message_id, channel="wecom", chat_id=chat_id, parts=(TextPart(text=text),)
    )


@pytest.mark.parametrize(
    ("errcode", "error"),
    [
        (45009, ChannelRateLimited),  # API frequency limit
        (45033, ChannelRateLimited),  # concurrency limit
        (-1, ChannelUnavailable),  # system busy
        (60020, ChannelSendAuthError),  # server IP not allowed
        (48002, ChannelSendAuthError),  # API forbidden for this app
        (81013, ChannelRejected),  # no valid recipient
        (40003, ChannelRejected),  # invalid UserID
    ],
)
async def test_errcodes_become_typed_delivery_errors(
    api: FakeWeComApi, errcode: int, error: type[Exception]
) -> None:
    api.send_errcode = errcode
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http, rate_limit_retry_seconds=7)
        with pytest.raises(error) as caught:
            await channel.send(_reply("hi"))
    assert str(errcode) in str(caught.value)
    if isinstance(caught.value, ChannelRateLimited):
        assert caught.value.retry_after == 7
    assert caught.value.retryable is (error in (ChannelRateLimited, ChannelUnavailable))  # type: ignore[attr-defined]


async def test_bad_secret_is_an_auth_error_and_an_unreachable_api_is_retryable(api: FakeWeComApi) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http, corp_secret="wrong")
        with pytest.raises(ChannelSendAuthError, match="40001"):
            await channel.send(_reply("hi"))
        channel = await _channel(api, http, api_base_url="http://127.0.0.1:9")
        with pytest.raises(ChannelUnavailable):
            await channel.send(_reply("hi"))
        channel = await _channel(api, http, agent_id=None)
        with pytest.raises(ChannelSendAuthError, match="WECOM_AGENT_ID"):
            await channel.send(_reply("hi"))


async def test_a_split_message_resumes_after_the_pieces_already_delivered(api: FakeWeComApi) -> None:
    text = "\n".join(f"line {i:02d} " + "字" * 20 for i in range(12))
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http, max_text_bytes=200)
        api.outage_after = 2
        with pytest.raises(ChannelUnavailable):
            await channel.send(_reply(text))
        api.outage_after = None
        await channel.send(_reply(text))  # the outbox's retry of the same message
    pieces = [c.body["text"]["content"] for c in api.sent]
    assert "".join(pieces) == text  # nothing twice, nothing lost
    assert all(len(p.encode()) <= 200 for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])  # cut at line breaks


async def test_app_chat_targets_and_images_as_links(api: FakeWeComApi) -> None:
    from app.events import ImagePart

    message = OutboundMessage(
        channel="wecom",
        chat_id="appchat:chat-42",
        parts=(TextPart(text="see"), ImagePart(url="https://example.com/a.png")),
    )
    async with httpx.AsyncClient(timeout=30) as http:
        channel = await _channel(api, http)
        result = await channel.send(message)
        assert (await channel.send(_reply("   "))).platform_message_id is None  # nothing to send
    [call] = api.sent
    assert call.path == "/cgi-bin/appchat/send"
    assert call.body == {
        "chatid": "chat-42",
        "msgtype": "text",
        "text": {"content": "see\nhttps://example.com/a.png"},
    }
    assert result.platform_message_id == "msg-1"
