"""Slack Events API end to end: the real app, slack_sdk's AsyncWebClient, a fake Web API."""

from __future__ import annotations

import time

import httpx

from app.agent.offline import OfflineProvider
from app.db.models import inbox, outbox
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack


async def test_dm_reaches_its_session_and_the_reply_reaches_slack(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_event(client, srv.url, sl.event_callback(sl.dm("hello there")))
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == "slack:D0ALICE"
            [call] = await fake.wait_for("chat.postMessage", 1)
            [row] = await wait_outbox_final(srv.runtime)
    assert fake.calls_of("auth.test"), "the bot learns its user id at start"
    assert call.headers["authorization"] == f"Bearer {sl.BOT_TOKEN}"
    assert call.params["channel"] == "D0ALICE"
    assert call.params["text"] == "You said: hello there"
    assert "thread_ts" not in call.params  # a DM is answered in the conversation
    assert row["status"] == "sent"
    assert row["platform_message_id"]


async def test_channel_mention_is_answered_in_its_thread_and_the_thread_is_one_session(
    serve: ServeApp,
) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            first = sl.mention("what is up")
            resp = await post_event(client, srv.url, sl.event_callback(first))
            key = resp.json()["session_key"]
            assert key == f"slack:C0GENERAL:{first['ts']}"
            await fake.wait_for("chat.postMessage", 1)
            follow = sl.mention("and then?", thread_ts=first["ts"])
            resp2 = await post_event(client, srv.url, sl.event_callback(follow))
            assert resp2.json()["session_key"] == key
            other = sl.mention("new topic")
            resp3 = await post_event(client, srv.url, sl.event_callback(other))
            assert resp3.json()["session_key"] == f"slack:C0GENERAL:{other['ts']}"
            calls = await fake.wait_for("chat.postMessage", 3)
            await wait_outbox_final(srv.runtime, 3)
    by_text = {c.params["text"]: c.params for c in calls}
    assert set(by_text) == {"You said: what is up", "You said: and then?", "You said: new topic"}
    assert by_text["You said: what is up"]["thread_ts"] == first["ts"]
    assert by_text["You said: and then?"]["thread_ts"] == first["ts"]
    assert by_text["You said: new topic"]["thread_ts"] == other["ts"]
    assert all(c.params["channel"] == "C0GENERAL" for c in calls)


async def test_url_verification_and_forged_or_stale_requests(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            url = f"{srv.url}/channels/slack/events"
            # url_verification is signed too: answered with the challenge only when genuine.
            challenge = {
                "token": "x",
                "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkv",
                "type": "url_verification",
            }
            resp = await post_event(client, srv.url, challenge)
            assert resp.status_code == 200
            assert resp.json()["challenge"] == challenge["challenge"]
            raw = sl.body_of(challenge)
            forged = await client.post(url, content=raw, headers=sl.signed_headers(raw, secret="guess"))
            assert forged.status_code == 401
            assert "challenge" not in forged.text

            body = sl.body_of(sl.event_callback(sl.dm("let me in")))
            now = int(time.time())
            cases = {
                "wrong secret": sl.signed_headers(body, secret="guess"),
                "stale": sl.signed_headers(body, timestamp=now - 301),
                "future": sl.signed_headers(body, timestamp=now + 400),
                "no signature": {"Content-Type": "application/json", "X-Slack-Request-Timestamp": str(now)},
                "no timestamp": {
                    k: v for k, v in sl.signed_headers(body).items() if k != "X-Slack-Request-Timestamp"
                },
                "tampered body": sl.signed_headers(body.replace(b"let me in", b"let me out")),
                "bad signature format": {**sl.signed_headers(body), "X-Slack-Signature": "v1=abc"},
            }
            for reason, headers in cases.items():
                resp = await client.post(url, content=body, headers=headers)
                assert resp.status_code == 401, (reason, resp.status_code, resp.text)
                assert resp.json()["detail"], reason
            # Signed but malformed: 400 with a reason.
            for bad in (b"{oops", b"[]", b'{"type": "event_callback"}'):
                resp = await client.post(url, content=bad, headers=sl.signed_headers(bad))
                assert resp.status_code == 400, (bad, resp.text)
            assert await count(srv.runtime, inbox) == 0
            # The server keeps serving.
            ok = await post_event(client, srv.url, sl.event_callback(sl.dm("let me in")))
            assert ok.status_code == 200
            await fake.wait_for("chat.postMessage", 1)
    assert [p["text"] for p in fake.posted()] == ["You said: let me in"]


async def test_retried_event_is_processed_once(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            payload = sl.event_callback(sl.dm("only once"))
            first = await post_event(client, srv.url, payload)
            for attempt in (1, 2, 3):
                resp = await post_event(
                    client,
                    srv.url,
                    payload,
                    headers={"X-Slack-Retry-Num": str(attempt), "X-Slack-Retry-Reason": "http_timeout"},
                )
                assert resp.status_code == 200
                assert resp.json()["duplicate"] is True
                assert resp.json()["event_id"] == first.json()["event_id"]
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
    assert [p["text"] for p in fake.posted()] == ["You said: only once"]


async def test_mention_announced_as_app_mention_and_message_is_one_turn(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            mention = sl.mention("hi both")
            as_message = {**mention, "type": "message", "channel_type": "channel"}
            await post_event(client, srv.url, sl.event_callback(mention))
            await post_event(client, srv.url, sl.event_callback(as_message))
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
    assert [p["text"] for p in fake.posted()] == ["You said: hi both"]


async def test_bot_messages_and_unmentioned_channel_messages_are_not_answered(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(channel_settings={"slack": slack_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            events = [
                sl.dm("from another bot", bot_id="BOTHER"),
                sl.dm("legacy bot", subtype="bot_message"),
                sl.dm("our own echo", user=sl.BOT_USER_ID),
                sl.dm("edited", subtype="message_changed"),
                sl.mention("a bot mentioning us", bot_id="BOTHER"),
                sl.channel_message("just talking, no mention"),
            ]
            for event in events:
                resp = await post_event(client, srv.url, sl.event_callback(event))
                assert resp.status_code == 200
                assert "ignored" in resp.json(), event
            # A barrier instead of a pause: a message that is answered, sent after the
            # ignored ones; once its answer is out, anything they caused would be too.
            resp = await post_event(client, srv.url, sl.event_callback(sl.dm("barrier")))
            assert resp.status_code == 200 and "ignored" not in resp.json()
            await fake.wait_for("chat.postMessage", 1)
            await wait_outbox_final(srv.runtime)
            assert await count(srv.runtime, inbox) == 1  # the barrier only
            assert await count(srv.runtime, outbox) == 1
    assert [p["text"] for p in fake.posted()] == ["You said: barrier"]


async def test_mention_gating_can_be_turned_off(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        open_settings = slack_settings(fake, require_mention_in_groups=False, reply_in_thread=False)
        async with (
            serve(channel_settings={"slack": open_settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_event(client, srv.url, sl.event_callback(sl.channel_message("open room")))
            assert resp.json()["session_key"] == "slack:C0GENERAL"
            [call] = await fake.wait_for("chat.postMessage", 1)
    assert call.params["text"] == "You said: open room"
    assert "thread_ts" not in call.params


async def test_ack_does_not_wait_for_the_agent(serve: ServeApp) -> None:
    async with FakeSlack() as fake:
        async with (
            serve(
                channel_settings={"slack": slack_settings(fake)}, provider=OfflineProvider(latency_ms=4000)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            started = time.monotonic()
            resp = await post_event(client, srv.url, sl.event_callback(sl.dm("slow thinking")))
            elapsed = time.monotonic() - started
            assert resp.status_code == 200
            # Well before the model's 4 s: the ack does not wait for it (margin for a busy CI).
            assert elapsed < 2.5, elapsed
            assert await count(srv.runtime, inbox) == 1  # committed before the ack
            await fake.wait_for("chat.postMessage", 1)
