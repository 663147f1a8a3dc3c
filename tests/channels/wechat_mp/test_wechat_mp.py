"""WeChat Official Account (公众号) end to end, in plaintext and safe mode: callbacks built
by the test's own WeChat, the app served for real, replies at a fake WeChat API server."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.db.models import inbox, outbox
from app.streaming.protocol import StreamingMode
from channels.wechat_mp import WeChatMpSettings
from tests.channels.support import count, session_messages, settled_outbox, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes.wechat_mp import FakeWeChatMpApi, WeChatMpCallbacks

TOKEN = "mp-server-token"
AES_KEY = base64.b64encode(bytes(range(64, 96))).decode().rstrip("=")
APP_ID = "wx-test-app"
URL = "/channels/wechat-mp"


def mp_settings(api: FakeWeChatMpApi, *, safe: bool = False, **overrides: Any) -> WeChatMpSettings:
    values: dict[str, Any] = dict(app_id=APP_ID, app_secret=api.app_secret, token=TOKEN, api_base_url=api.url)
    if safe:
        values["encoding_aes_key"] = AES_KEY
    values.update(overrides)
    return WeChatMpSettings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
async def api() -> AsyncIterator[FakeWeChatMpApi]:
    async with FakeWeChatMpApi(app_id=APP_ID) as fake:
        yield fake


@pytest.fixture
def wechat() -> WeChatMpCallbacks:
    return WeChatMpCallbacks(TOKEN, APP_ID, AES_KEY)


async def _post(client: httpx.AsyncClient, base: str, callback: Any) -> httpx.Response:
    return await client.post(
        base + URL, params=callback.query, content=callback.body, headers={"Content-Type": "text/xml"}
    )


async def test_url_verification_returns_echostr_as_is(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    # URL verification is plaintext in every mode, so check it with safe mode configured.
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api, safe=True)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await client.get(srv.url + URL, params=wechat.verify_url("4857219873452"))
        assert resp.status_code == 200, resp.text
        assert resp.text == "4857219873452"
        forged = {**wechat.verify_url("x"), "signature": "a" * 40}
        assert (await client.get(srv.url + URL, params=forged)).status_code == 401
        unsigned = wechat.verify_url("x")
        del unsigned["signature"]
        assert (await client.get(srv.url + URL, params=unsigned)).status_code == 401
        stale = wechat.verify_url("x", timestamp=int(time.time()) - 400)
        assert (await client.get(srv.url + URL, params=stale)).status_code == 401


async def test_plaintext_message_reaches_its_session_and_reply_uses_customer_service_api(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(
            client, srv.url, wechat.plaintext(wechat.text("openid-1", "早上好", 11), openid="openid-1")
        )
        assert resp.status_code == 200, resp.text
        assert resp.text == "success"
        [sent] = await api.wait_for_sent(1)
        assert sent.path == "/cgi-bin/message/custom/send"
        assert sent.body == {"touser": "openid-1", "msgtype": "text", "text": {"content": "You said: 早上好"}}
        assert api.calls[0].path == "/cgi-bin/stable_token"  # the default token endpoint
        assert api.calls[0].body == {
            "grant_type": "client_credential",
            "appid": APP_ID,
            "secret": "app-secret",
        }

        # A voice message with WeChat's speech recognition arrives as its transcript.
        await _post(client, srv.url, wechat.plaintext(wechat.voice("openid-1", "明天天气", 12)))
        await api.wait_for_sent(2)
        history = await session_messages(client, srv.url, "wechat-mp:openid-1")
        assert [(m["role"], m["content"]) for m in history] == [
            ("user", "早上好"),
            ("assistant", "You said: 早上好"),
            ("user", "明天天气"),
            ("assistant", "You said: 明天天气"),
        ]
        assert api.token_requests == 1


async def test_safe_mode_message_is_decrypted_and_plaintext_is_then_refused(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    settings = mp_settings(api, safe=True, token_endpoint="classic")
    async with (
        serve(channel_settings={"wechat-mp": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv.url, wechat.encrypted(wechat.text("openid-2", "secret hello", 21)))
        assert resp.status_code == 200, resp.text
        assert resp.text == "success"
        [sent] = await api.wait_for_sent(1)
        assert sent.body["touser"] == "openid-2"
        assert sent.body["text"]["content"] == "You said: secret hello"
        assert api.calls[0].path == "/cgi-bin/token"
        assert api.calls[0].query == {
            "grant_type": "client_credential",
            "appid": APP_ID,
            "secret": "app-secret",
        }

        # With an EncodingAESKey configured, a plaintext callback is a downgrade: refused.
        downgrade = await _post(client, srv.url, wechat.plaintext(wechat.text("openid-2", "plain", 22)))
        assert downgrade.status_code == 401
        assert "safe mode" in downgrade.json()["detail"]
        assert await count(srv.runtime, inbox) == 1


async def test_redelivered_message_is_processed_once(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    inner = wechat.text("openid-3", "once", 31)
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api, safe=True)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for _ in range(3):  # WeChat retries up to three times when we are slow
            assert (await _post(client, srv.url, wechat.encrypted(inner))).status_code == 200
        await api.wait_for_sent(1)
        # A later message from the same person is the barrier: a duplicated reply to the
        # redelivered one would be sent before the barrier's.
        barrier = wechat.encrypted(wechat.text("openid-3", "barrier", 32))
        assert (await _post(client, srv.url, barrier)).status_code == 200
        sent = await api.wait_for_sent(2)
        assert ["barrier" in str(call.body) for call in sent] == [False, True]
        assert await count(srv.runtime, inbox) == 2
        assert await count(srv.runtime, outbox) == 2


async def test_forged_stale_or_malformed_callbacks_get_4xx_and_store_nothing(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    good = wechat.text("openid-4", "hi", 41)
    good_plain = wechat.text("openid-4", "hi", 42)
    forged = wechat.encrypted(good)
    forged.query["msg_signature"] = "b" * 40
    no_msg_sig = wechat.encrypted(good)
    del no_msg_sig.query["msg_signature"]
    bomb = (
        '<!DOCTYPE xml [<!ENTITY a "aaaa"><!ENTITY b "&a;&a;&a;&a;">]>'
        "<xml><FromUserName>x</FromUserName><MsgType>text</MsgType><Content>&b;</Content></xml>"
    )
    safe_cases = [
        ("forged msg_signature", forged, 401),
        ("missing msg_signature", no_msg_sig, 401),
        ("stale timestamp", wechat.encrypted(good, timestamp=int(time.time()) - 900), 401),
        ("wrong AppID", wechat.encrypted(good, receive_id="wx-other-app"), 403),
        ("entity bomb inside", wechat.encrypted(bomb), 400),
        ("malformed inner XML", wechat.encrypted("<xml><MsgType>"), 400),
        ("undecryptable", wechat.encrypted(good, encrypt=base64.b64encode(b"y" * 48).decode()), 400),
    ]
    plain_forged = wechat.plaintext(good)
    plain_forged.query["signature"] = "c" * 40
    plain_cases = [
        ("forged signature", plain_forged, 401),
        ("malformed XML", wechat.plaintext("<xml><Content>unclosed"), 400),
        ("DOCTYPE", wechat.plaintext(bomb), 400),
        ("not a message", wechat.plaintext("<xml><ToUserName>gh</ToUserName></xml>"), 400),
    ]
    for settings, cases in (
        (mp_settings(api, safe=True), safe_cases),
        (mp_settings(api), plain_cases),
    ):
        # Both rounds share one database: the first round's good message stays stored.
        async with (
            serve(channel_settings={"wechat-mp": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            before = await count(srv.runtime, inbox)
            for reason, callback, status in cases:
                resp = await _post(client, srv.url, callback)
                assert resp.status_code == status, (reason, resp.status_code, resp.text)
                assert resp.json()["detail"], reason
            assert await count(srv.runtime, inbox) == before
            ok = wechat.encrypted(good) if settings.encoding_aes_key else wechat.plaintext(good_plain)
            assert (await _post(client, srv.url, ok)).status_code == 200  # still serving
            assert await count(srv.runtime, inbox) == before + 1


async def test_platform_outage_on_send_is_retried_then_recorded_failed(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    api.outage = True
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api)}, outbox_max_attempts=3) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await _post(client, srv.url, wechat.plaintext(wechat.text("openid-5", "hello?", 51)))
        [row] = await settled_outbox(srv.runtime)
        assert row.status == "failed"
        assert row.attempts == 3
        assert "503" in row.last_error
    assert api.send_attempts == 3
    assert api.sent == []


async def test_expired_or_invalid_access_token_is_refreshed_and_the_send_retried(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    # No typing state: a typing call may meet the revoked token before the send does and
    # refresh it, and this test counts the send's own retry.
    settings = mp_settings(api, streaming=StreamingMode.OFF)
    async with (
        serve(channel_settings={"wechat-mp": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await _post(client, srv.url, wechat.plaintext(wechat.text("openid-6", "one", 61)))
        await api.wait_for_sent(1)
        api.revoke_tokens(42001)
        await _post(client, srv.url, wechat.plaintext(wechat.text("openid-6", "two", 62)))
        await api.wait_for_sent(2)
        api.revoke_tokens(40001)  # "access_token is invalid or not latest"
        await _post(client, srv.url, wechat.plaintext(wechat.text("openid-6", "three", 63)))
        sent = await api.wait_for_sent(3)
    assert [c.query["access_token"] for c in sent] == ["token-1", "token-2", "token-3"]
    assert api.token_requests == 3
    assert api.send_attempts == 5


async def test_subscribe_is_a_silent_join_and_menu_click_is_a_message(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    now = int(time.time())
    async with (
        serve(channel_settings={"wechat-mp": mp_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        sub = await _post(client, srv.url, wechat.plaintext(wechat.event("openid-7", "subscribe", now)))
        assert (sub.status_code, sub.text) == (200, "success")
        for _ in range(2):  # the click, and WeChat redelivering it (events dedup on user + time)
            click = wechat.plaintext(wechat.event("openid-7", "CLICK", now, event_key="/new"))
            assert (await _post(client, srv.url, click)).status_code == 200
        await _post(client, srv.url, wechat.plaintext(wechat.event("openid-7", "VIEW", now)))  # ignored
        await wait_inbox_done(srv.runtime)
        assert await count(srv.runtime, inbox) == 2  # the join and the click
        await api.wait_for_sent(1)
        await wait_inbox_done(srv.runtime)
        await settled_outbox(srv.runtime)
    # Only the click's answer: without WECHAT_MP_WELCOME_TEXT a follow says nothing.
    assert [c.body["text"]["content"] for c in api.sent] == ["Started a new conversation."]


async def test_plaintext_allowed_explicitly_and_the_previous_key_after_a_rotation(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    new_key = base64.b64encode(bytes(range(128, 160))).decode().rstrip("=")
    settings = mp_settings(
        api, encoding_aes_key=new_key, previous_encoding_aes_key=AES_KEY, allow_plaintext=True
    )
    rotated = WeChatMpCallbacks(TOKEN, APP_ID, new_key)
    callbacks = [
        wechat.encrypted(wechat.text("openid-8", "old key", 81)),  # accepted while the new key rolls out
        rotated.encrypted(rotated.text("openid-8", "new key", 82)),
        wechat.plaintext(wechat.text("openid-8", "plain", 83)),  # allowed explicitly
    ]
    async with (
        serve(channel_settings={"wechat-mp": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for n, callback in enumerate(callbacks, start=1):
            assert (await _post(client, srv.url, callback)).status_code == 200
            await api.wait_for_sent(n)
        assert await count(srv.runtime, inbox) == 3
    assert [c.body["text"]["content"] for c in api.sent] == [
        "You said: old key",
        "You said: new key",
        "You said: plain",
    ]
