"""WeCom (企业微信) end to end: callbacks signed and encrypted by the test's own WeCom,
the app served for real, replies delivered to a fake WeCom API server."""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from app.db.models import inbox, outbox
from channels.wecom import WeComSettings
from tests.channels.support import count, session_messages, settled_outbox
from tests.conftest import ServeApp
from tests.fakes.wecom import FakeWeComApi, WeComCallbacks, cdata_xml

TOKEN = "wecom-callback-token"
AES_KEY = base64.b64encode(bytes(range(32))).decode().rstrip("=")
CORP_ID = "ww-test-corp"
AGENT_ID = 1000002


def wecom_settings(api: FakeWeComApi, **overrides: Any) -> WeComSettings:
    values: dict[str, Any] = dict(
        corp_id=CORP_ID,
        corp_secret=api.corp_secret,
        agent_id=AGENT_ID,
        token=TOKEN,
        encoding_aes_key=AES_KEY,
        api_base_url=api.url,
    )
    values.update(overrides)
    return WeComSettings(_env_file=None, **values)  # type: ignore[call-arg]


@pytest.fixture
async def api() -> AsyncIterator[FakeWeComApi]:
    async with FakeWeComApi(corp_id=CORP_ID) as fake:
        yield fake


@pytest.fixture
def wecom() -> WeComCallbacks:
    return WeComCallbacks(TOKEN, AES_KEY, CORP_ID, AGENT_ID)


async def _post(client: httpx.AsyncClient, base: str, callback: Any) -> httpx.Response:
    return await client.post(
        f"{base}/channels/wecom",
        params=callback.query,
        content=callback.body,
        headers={"Content-Type": "text/xml"},
    )


async def test_url_verification_answers_the_decrypted_echostr(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        url = f"{srv.url}/channels/wecom"
        resp = await client.get(url, params=wecom.verify_url("1616140317555161061"))
        assert resp.status_code == 200, resp.text
        assert resp.text == "1616140317555161061"  # no quotes, no newline
        assert resp.headers["content-type"].startswith("text/plain")

        bad = wecom.verify_url("echo", msg_signature="0" * 40)
        assert (await client.get(url, params=bad)).status_code == 401
        stale = wecom.verify_url("echo", timestamp=int(time.time()) - 301)
        assert (await client.get(url, params=stale)).status_code == 401
        other_corp = WeComCallbacks(TOKEN, AES_KEY, "ww-other-corp", AGENT_ID)
        resp = await client.get(url, params=other_corp.verify_url("echo"))
        assert resp.status_code == 403, resp.text
        assert "CorpID" in resp.json()["detail"]


async def test_message_reaches_its_session_and_the_reply_goes_through_the_api(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv.url, wecom.post(wecom.text("zhangsan", "你好 & hello", 1001)))
        assert resp.status_code == 200, resp.text
        assert resp.content == b""  # "no passive reply": the answer comes through the API

        [sent] = await api.wait_for_sent(1)
        assert sent.path == "/cgi-bin/message/send"
        assert sent.query["access_token"] == "token-1"
        assert sent.body == {
            "touser": "zhangsan",
            "msgtype": "text",
            "agentid": AGENT_ID,
            "text": {"content": "You said: 你好 & hello"},
        }
        history = await session_messages(client, srv.url, "wecom:zhangsan")
        assert [(m["role"], m["content"]) for m in history] == [
            ("user", "你好 & hello"),
            ("assistant", "You said: 你好 & hello"),
        ]

        # A second message reuses the cached access token.
        await _post(client, srv.url, wecom.post(wecom.text("zhangsan", "again", 1002)))
        await api.wait_for_sent(2)
        assert api.token_requests == 1
        assert [r.status for r in await settled_outbox(srv.runtime)] == ["sent", "sent"]


async def test_redelivered_message_is_processed_once(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    inner = wecom.text("lisi", "only once", 2001)
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        # WeCom retries the same message (same MsgId) up to three times, each one signed anew.
        for _ in range(3):
            resp = await _post(client, srv.url, wecom.post(inner))
            assert resp.status_code == 200
        await api.wait_for_sent(1)
        # A later message from the same person is the barrier: a duplicated reply to the
        # redelivered one would be sent before the barrier's.
        await _post(client, srv.url, wecom.post(wecom.text("lisi", "barrier", 2002)))
        sent = await api.wait_for_sent(2)
        assert ["barrier" in str(call.body) for call in sent] == [False, True]
        assert await count(srv.runtime, inbox) == 2
        assert await count(srv.runtime, outbox) == 2


async def test_forged_stale_or_malformed_callbacks_get_4xx_and_store_nothing(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    good = wecom.text("wangwu", "hi", 3001)
    forged = wecom.post(good)
    forged.query["msg_signature"] = "f" * 40
    entity_bomb = (
        '<?xml version="1.0"?><!DOCTYPE xml [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        "<xml><FromUserName>x</FromUserName><MsgType>text</MsgType><Content>&b;</Content></xml>"
    )
    external = (
        '<!DOCTYPE xml [<!ENTITY e SYSTEM "file:///etc/passwd">]>'
        "<xml><FromUserName>x</FromUserName><MsgType>text</MsgType><Content>&e;</Content></xml>"
    )
    missing_sig = wecom.post(good)
    del missing_sig.query["msg_signature"]
    cases = [
        ("forged signature", forged, 401),
        ("missing signature", missing_sig, 401),
        ("stale timestamp", wecom.post(good, timestamp=int(time.time()) - 600), 401),
        ("wrong receive id", wecom.post(good, receive_id="ww-other-corp"), 403),
        ("other app's AgentID", wecom.post(wecom.text("wangwu", "hi", 3002, agent_id=999)), 403),
        ("malformed outer XML", wecom.post(good, outer="<xml><Encrypt>"), 400),
        ("outer DOCTYPE", wecom.post(good, outer=entity_bomb), 400),
        ("no Encrypt element", wecom.post(good, outer="<xml><ToUserName>x</ToUserName></xml>"), 400),
        ("malformed inner XML", wecom.post("<xml><FromUserName>x</xml>"), 400),
        ("entity bomb inside", wecom.post(entity_bomb), 400),
        ("external entity inside", wecom.post(external), 400),
        ("no MsgType", wecom.post(cdata_xml({"FromUserName": "x"})), 400),
        ("undecryptable Encrypt", wecom.post(good, encrypt=base64.b64encode(b"x" * 32).decode()), 400),
        ("Encrypt not base64", wecom.post(good, encrypt="not base64!"), 400),
    ]
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for reason, callback, status in cases:
            resp = await _post(client, srv.url, callback)
            assert resp.status_code == status, (reason, resp.status_code, resp.text)
            assert resp.json()["detail"], reason
        assert await count(srv.runtime, inbox) == 0
        huge = wecom.post(wecom.text("wangwu", "x" * 70_000, 3003))
        assert (await _post(client, srv.url, huge)).status_code == 413
        assert await count(srv.runtime, inbox) == 0
        # ... and the service keeps serving.
        assert (await _post(client, srv.url, wecom.post(good))).status_code == 200
        assert await count(srv.runtime, inbox) == 1
    assert api.token_requests <= 1


async def test_platform_outage_on_send_is_retried_then_recorded_failed(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    api.outage = True
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}, outbox_max_attempts=3) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await _post(client, srv.url, wecom.post(wecom.text("zhaoliu", "anyone there?", 4001)))
        [row] = await settled_outbox(srv.runtime)
        assert row.status == "failed"
        assert row.attempts == 3
        assert "503" in row.last_error
    assert api.send_attempts == 3
    assert api.sent == []


async def test_expired_or_invalid_access_token_is_refreshed_and_the_send_retried(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await _post(client, srv.url, wecom.post(wecom.text("sunqi", "one", 5001)))
        await api.wait_for_sent(1)
        api.revoke_tokens(42001)  # WeCom expired the token early
        await _post(client, srv.url, wecom.post(wecom.text("sunqi", "two", 5002)))
        await api.wait_for_sent(2)
        api.revoke_tokens(40014)  # ... or says it is invalid
        await _post(client, srv.url, wecom.post(wecom.text("sunqi", "three", 5003)))
        sent = await api.wait_for_sent(3)
    assert [c.query["access_token"] for c in sent] == ["token-1", "token-2", "token-3"]
    assert [c.body["text"]["content"] for c in sent] == ["You said: one", "You said: two", "You said: three"]
    assert api.token_requests == 3
    assert api.send_attempts == 5  # two sends were refused once each, then retried


async def test_long_reply_is_split_within_2048_bytes(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    text = "长" * 1500  # 4500 UTF-8 bytes
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await _post(client, srv.url, wecom.post(wecom.text("qianba", text, 6001)))
        sent = await api.wait_for_sent(3)
    pieces = [c.body["text"]["content"] for c in sent]
    assert all(len(p.encode()) <= 2048 for p in pieces)
    assert "".join(pieces) == "You said: " + text


async def test_image_and_menu_click_become_parts_and_notifications_are_ignored(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks
) -> None:
    now = int(time.time())
    async with (
        serve(channel_settings={"wecom": wecom_settings(api)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        steps = [
            (wecom.event("zhouj", "enter_agent", now), 0),  # a notification: acknowledged, not stored
            (wecom.image("zhouj", "https://wework.qpic.cn/pic.jpg", 7001), 1),
            (wecom.event("zhouj", "click", now, event_key="menu-help"), 2),
            (wecom.event("zhouj", "click", now, event_key="menu-help"), 2),  # the event redelivered
        ]
        for inner, replies in steps:
            resp = await _post(client, srv.url, wecom.post(inner))
            assert resp.status_code == 200, resp.text
            await api.wait_for_sent(replies)
        assert await count(srv.runtime, inbox) == 2
        history = await session_messages(client, srv.url, "wecom:zhouj")
    users = [m for m in history if m["role"] == "user"]
    [image] = users[0]["parts"]
    assert (image["type"], image["url"]) == ("image", "https://wework.qpic.cn/pic.jpg")
    assert users[1]["content"] == "menu-help"


async def test_unconfigured_channel_answers_503(serve: ServeApp, wecom: WeComCallbacks) -> None:
    settings = WeComSettings(_env_file=None)  # type: ignore[call-arg]
    async with serve(channel_settings={"wecom": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
        resp = await _post(client, srv.url, wecom.post(wecom.text("u", "hi", 1)))
        assert resp.status_code == 503
        assert "WECOM_TOKEN" in resp.json()["detail"]
