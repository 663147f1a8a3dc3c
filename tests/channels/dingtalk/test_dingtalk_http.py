"""The HTTP callback: signed requests stored once and answered at the right target."""

from __future__ import annotations

import json
import time

import httpx

from app.db.models import inbox
from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.support import count, inbox_keys, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk


async def test_single_and_group_messages_are_answered_at_their_targets(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            single = await post_message(client, srv.url, dt.robot_message("hello"))
            assert single.status_code == 200, single.text
            assert single.json()["session_key"] == "dingtalk:staff-alice"
            group = await post_message(
                client, srv.url, dt.robot_message("hi all", group=True, staff_id="bob")
            )
            assert group.status_code == 200, group.text
            assert group.json()["session_key"] == "dingtalk:cidGROUP001=="
            rich = await post_message(client, srv.url, dt.robot_message("rich words", rich=True))
            assert rich.status_code == 200, rich.text
            await wait_outbox_final(srv.runtime, 3)
            assert await inbox_keys(srv.runtime) == [
                "dingtalk:staff-alice",
                "dingtalk:cidGROUP001==",
                "dingtalk:staff-alice",
            ]
    [to_group] = fake.calls_of(dt.GROUP_SEND)
    assert to_group.body["openConversationId"] == "cidGROUP001=="
    assert to_group.body["robotCode"] == dt.CLIENT_ID
    assert json.loads(to_group.body["msgParam"]) == {"content": "You said: hi all"}
    to_alice = fake.calls_of(dt.SINGLE_SEND)
    assert [c.body["userIds"] for c in to_alice] == [["staff-alice"], ["staff-alice"]]
    assert sorted(json.loads(c.body["msgParam"])["content"] for c in to_alice) == [
        "You said: hello",
        "You said: rich words",
    ]
    # One access token, asked once and used for every send.
    assert len(fake.calls_of(dt.TOKEN_PATH)) == 1
    assert {c.headers["x-acs-dingtalk-access-token"] for c in fake.calls_of(dt.GROUP_SEND)} == {"token-1"}


async def test_forged_stale_or_unsigned_requests_get_401_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            message = dt.robot_message("let me in")
            forged = await post_message(client, srv.url, message, headers=dt.signed_headers(secret="guess"))
            two_hours_ago = int((time.time() - 7200) * 1000)
            stale = await post_message(
                client, srv.url, message, headers=dt.signed_headers(timestamp_ms=two_hours_ago)
            )
            unsigned = await post_message(
                client, srv.url, message, headers={"Content-Type": "application/json"}
            )
            assert [r.status_code for r in (forged, stale, unsigned)] == [401, 401, 401]
            assert "sign does not match" in forged.json()["detail"]
            assert "away from server time" in stale.json()["detail"]
            assert "missing timestamp" in unsigned.json()["detail"]
            # Well signed but not a robot message: 400 with the reason; the service keeps serving.
            bad = await post_message(client, srv.url, {"msgId": "m1", "conversationType": "1"})
            assert bad.status_code == 400
            assert "conversationId" in bad.json()["detail"]
            assert await count(srv.runtime, inbox) == 0
            ok = await post_message(client, srv.url, message)
            assert ok.status_code == 200
            assert await count(srv.runtime, inbox) == 1


async def test_redelivery_is_processed_once(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            message = dt.robot_message("only once")
            first = await post_message(client, srv.url, message)
            again = await post_message(client, srv.url, message)
            assert again.json()["duplicate"] is True
            assert again.json()["event_id"] == first.json()["event_id"]
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
    assert len(fake.delivered()) == 1


async def test_group_messages_without_a_mention_are_ignored_unless_configured(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_message(client, srv.url, dt.robot_message("chatter", group=True, at_me=False))
            assert resp.status_code == 200
            assert "without a mention" in resp.json()["ignored"]
            assert await count(srv.runtime, inbox) == 0
        settings = dingtalk_settings(fake, require_mention_in_groups=False)
        async with (
            serve(channel_settings={"dingtalk": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_message(client, srv.url, dt.robot_message("chatter", group=True, at_me=False))
            assert resp.json()["session_key"] == "dingtalk:cidGROUP001=="
            await wait_outbox_final(srv.runtime)
    assert [c.body["openConversationId"] for c in fake.delivered()] == ["cidGROUP001=="]


async def test_replies_use_the_session_webhook_while_valid_then_the_robot_api(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            valid = fake.webhook_url
            await post_message(client, srv.url, dt.robot_message("via webhook", group=True, webhook=valid))
            await wait_outbox_final(srv.runtime, 1)
            expired_ms = int((time.time() - 60) * 1000)
            expired = dt.robot_message(
                "late", group=True, webhook=fake.webhook_url, webhook_expires_ms=expired_ms
            )
            await post_message(client, srv.url, expired)
            await wait_outbox_final(srv.runtime, 2)
    [hook] = fake.calls_of(dt.WEBHOOK_PATH)
    assert f"{fake.url}{hook.path}?session={hook.query['session']}" == valid
    assert hook.body == {"msgtype": "text", "text": {"content": "You said: via webhook"}}
    [api] = fake.calls_of(dt.GROUP_SEND)
    assert json.loads(api.body["msgParam"]) == {"content": "You said: late"}
