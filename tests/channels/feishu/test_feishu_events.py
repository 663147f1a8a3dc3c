"""Feishu event callbacks end to end: the real app, a fake Open API, callbacks built by Feishu's rules."""

from __future__ import annotations

import json
import time

import httpx

from app.agent.offline import OfflineProvider
from app.db.models import inbox, outbox
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import count, inbox_keys, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu


async def test_direct_message_reaches_its_session_and_the_reply_reaches_the_chat(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.text_event("hello there"))
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == "feishu:oc_alice"
            [call] = await fake.wait_for(1)
            [row] = await wait_outbox_final(srv.runtime)
    assert fake.calls_of("bot_info"), "the bot learns its open_id at start"
    assert call.kind == "create"
    assert call.params == {"receive_id_type": "chat_id"}
    assert call.body["receive_id"] == "oc_alice"
    assert call.body["msg_type"] == "text"
    assert call.text == "You said: hello there"
    [token] = fake.calls_of("token")
    assert token.body == {"app_id": fs.APP_ID, "app_secret": fs.APP_SECRET}
    assert call.token == "t-0001"
    assert row["status"] == "sent"
    assert row["platform_message_id"] == "om_sent0001"


async def test_group_mention_is_answered_as_a_reply_and_threads_follow_the_thread_scope(
    serve: ServeApp,
) -> None:
    async with FakeFeishu() as fake:
        settings = feishu_settings(fake, session_scope="thread")
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            first = fs.group_mention("what is up", message_id="om_root1")
            resp = await post_callback(client, srv.url, first)
            assert resp.json()["session_key"] == "feishu:oc_team"
            await fake.wait_for(1)
            # A reply in the topic thread under om_root1: same thread, its own session.
            in_thread = fs.group_mention(
                "and then?",
                message_id="om_child1",
                root_id="om_root1",
                parent_id="om_root1",
                thread_id="omt_1",
            )
            resp2 = await post_callback(client, srv.url, in_thread)
            assert resp2.json()["session_key"] == "feishu:oc_team:om_root1"
            calls = await fake.wait_for(2)
            await wait_outbox_final(srv.runtime, 2)
    by_text = {c.text: c for c in calls}
    plain = by_text["You said: what is up"]
    assert (plain.kind, plain.path) == ("reply", "/open-apis/im/v1/messages/om_root1/reply")
    assert plain.body["reply_in_thread"] is False
    threaded = by_text["You said: and then?"]
    assert (threaded.kind, threaded.path) == ("reply", "/open-apis/im/v1/messages/om_child1/reply")
    assert threaded.body["reply_in_thread"] is True


async def test_reply_in_thread_opens_a_thread_that_is_one_session(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        settings = feishu_settings(fake, session_scope="thread", reply_in_thread=True)
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.group_mention("topic", message_id="om_t1"))
            assert resp.json()["session_key"] == "feishu:oc_team:om_t1"
            follow = fs.group_mention("more", root_id="om_t1", thread_id="omt_9")
            resp2 = await post_callback(client, srv.url, follow)
            assert resp2.json()["session_key"] == "feishu:oc_team:om_t1"
            calls = await fake.wait_for(2)
    assert all(c.kind == "reply" and c.body["reply_in_thread"] is True for c in calls)


async def test_url_verification_plain_and_encrypted(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        plain_only = feishu_settings(fake, encrypt_key=None)
        async with (
            serve(channel_settings={"feishu": plain_only}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.url_verification("c-plain"), encrypt_key=None)
            assert (resp.status_code, resp.json()) == (200, {"challenge": "c-plain"})
            wrong = await post_callback(
                client, srv.url, fs.url_verification("c-x", token="guess"), encrypt_key=None
            )
            assert wrong.status_code == 401
            assert "challenge" not in wrong.text
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Feishu encrypts the challenge too once an Encrypt Key is set.
            resp = await post_callback(client, srv.url, fs.url_verification("c-secret"))
            assert (resp.status_code, resp.json()) == (200, {"challenge": "c-secret"})
            other_key = await post_callback(
                client, srv.url, fs.url_verification("c-y"), encrypt_key="another key"
            )
            assert other_key.status_code == 401
            assert "c-y" not in other_key.text
            # Unsigned, with an Encrypt Key set: one answer for every way to fail, so an
            # unsigned request tells nothing about a ciphertext (no padding oracle).
            url = f"{srv.url}/channels/feishu"
            plain_json = {"Content-Type": "application/json"}
            wrong_key = fs.encrypt(json.dumps(fs.url_verification("c-w")).encode(), key="another key")
            unsigned = [
                await client.post(url, content=json.dumps({"encrypt": wrong_key}), headers=plain_json),
                await post_callback(client, srv.url, fs.url_verification("c-z"), encrypt_key=None),
                await client.post(url, content=json.dumps({"encrypt": "not base64!"}), headers=plain_json),
                await client.post(
                    url, content=json.dumps({"encrypt": fs.encrypt(b"{oops")}), headers=plain_json
                ),
                await client.post(url, content=b"{oops", headers=plain_json),
                await client.post(
                    url,
                    content=json.dumps({"encrypt": fs.encrypt(json.dumps(fs.text_event("hi")).encode())}),
                    headers=plain_json,
                ),
            ]
            assert len({(r.status_code, r.text) for r in unsigned}) == 1
            assert unsigned[0].status_code == 401
            assert await count(srv.runtime, inbox) == 0


async def test_forged_stale_or_wrong_token_is_refused_and_nothing_is_stored(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            url = f"{srv.url}/channels/feishu"
            event = fs.text_event("let me in")
            body, good = fs.callback(event)
            now = int(time.time())
            # Each case: a body and the headers that came with it.
            cases = {
                "wrong signing key": (body, fs.callback(event, signing_key="guess")[1]),
                "stale": fs.callback(event, timestamp=now - 301),
                "future": fs.callback(event, timestamp=now + 400),
                "no signature": (body, {k: v for k, v in good.items() if k != "X-Lark-Signature"}),
                "no nonce": (body, {k: v for k, v in good.items() if k != "X-Lark-Request-Nonce"}),
                "no headers": (body, {"Content-Type": "application/json"}),
                "signature of another body": (body, {**good, "X-Lark-Signature": fs.sign("1", "n", b"{}")}),
                "tampered body": (body.replace(b'"}', b'A"}'), good),
            }
            for reason, (content, headers) in cases.items():
                resp = await client.post(url, content=content, headers=headers)
                assert resp.status_code == 401, (reason, resp.status_code, resp.text)
                assert resp.json()["detail"], reason
            # Encrypted with another key but signed with ours: cannot be opened.
            body2, headers2 = fs.callback(event, encrypt_key="another key", signing_key=fs.ENCRYPT_KEY)
            resp = await client.post(url, content=body2, headers=headers2)
            assert resp.status_code == 401, resp.text
            assert "FEISHU_ENCRYPT_KEY" in resp.json()["detail"]
            # Genuinely signed and encrypted, but the verification token is wrong.
            resp = await post_callback(client, srv.url, fs.text_event("token?", token="guess"))
            assert resp.status_code == 401, resp.text
            assert "verification token" in resp.json()["detail"]
            # Signed but malformed: 400 with a reason.
            for bad in (b"{oops", b"[]", json.dumps({"schema": "2.0"}).encode()):
                ts, nonce = str(now), "n1"
                headers = {
                    "Content-Type": "application/json",
                    "X-Lark-Request-Timestamp": ts,
                    "X-Lark-Request-Nonce": nonce,
                    "X-Lark-Signature": fs.sign(ts, nonce, bad),
                }
                resp = await client.post(url, content=bad, headers=headers)
                assert resp.status_code == 400, (bad, resp.text)
            assert await count(srv.runtime, inbox) == 0
            # The server keeps serving.
            ok = await post_callback(client, srv.url, fs.text_event("let me in"))
            assert ok.status_code == 200, ok.text
            await fake.wait_for(1)
    assert [c.text for c in fake.delivered()] == ["You said: let me in"]


async def test_plain_callbacks_are_checked_by_the_verification_token(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake, encrypt_key=None)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            bad = await post_callback(client, srv.url, fs.text_event("no", token="guess"), encrypt_key=None)
            assert bad.status_code == 401
            missing = fs.text_event("no token")
            del missing["header"]["token"]
            assert (await post_callback(client, srv.url, missing, encrypt_key=None)).status_code == 401
            # An encrypted body while no Encrypt Key is configured: refused, nothing stored.
            enc = await post_callback(client, srv.url, fs.text_event("enc"))
            assert enc.status_code == 503
            assert await count(srv.runtime, inbox) == 0
            ok = await post_callback(client, srv.url, fs.text_event("plain hello"), encrypt_key=None)
            assert ok.status_code == 200, ok.text
            [call] = await fake.wait_for(1)
    assert call.text == "You said: plain hello"


async def test_redelivered_event_is_processed_once(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = fs.text_event("only once")
            first = await post_callback(client, srv.url, event)
            for _ in range(3):
                # Each redelivery is encrypted and signed anew; the event_id stays.
                resp = await post_callback(client, srv.url, event)
                assert resp.status_code == 200
                assert resp.json()["duplicate"] is True
                assert resp.json()["event_id"] == first.json()["event_id"]
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
    assert [c.text for c in fake.delivered()] == ["You said: only once"]


async def test_group_messages_without_a_mention_of_the_bot_are_not_answered(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            someone = fs.bot_mention(open_id="ou_bob", name="Bob")
            events = [
                fs.text_event("just talking", chat_type="group", chat_id="oc_team"),
                fs.text_event("@_user_1 hi Bob", chat_type="group", chat_id="oc_team", mentions=[someone]),
                fs.text_event("from an app", sender_type="app"),
                fs.text_event("our own echo", sender=fs.BOT_OPEN_ID),
                fs.text_event("a read receipt", event_type="im.message.message_read_v1"),
            ]
            for event in events:
                resp = await post_callback(client, srv.url, event)
                assert resp.status_code == 200, resp.text
                assert "ignored" in resp.json(), event
            # "ignored" is answered after the decision: nothing to wait for.
            assert await count(srv.runtime, inbox) == 0
            # Mentioned: answered, and the mention placeholder is not part of the text.
            both = [
                fs.bot_mention(key="@_user_1", open_id="ou_bob", name="Bob"),
                fs.bot_mention(key="@_user_2"),
            ]
            mentioned = fs.text_event(
                "@_user_2 ask @_user_1", chat_type="group", chat_id="oc_team", mentions=both
            )
            resp = await post_callback(client, srv.url, mentioned)
            assert resp.json()["session_key"] == "feishu:oc_team"
            [call] = await fake.wait_for(1)
            assert await count(srv.runtime, inbox) == 1  # the ignored ones were never stored
    assert call.text == "You said: ask @Bob"


async def test_mention_gating_can_be_turned_off(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        settings = feishu_settings(fake, require_mention_in_groups=False, reply_to_message=False)
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = fs.text_event("open room", chat_type="group", chat_id="oc_team")
            resp = await post_callback(client, srv.url, event)
            assert resp.json()["session_key"] == "feishu:oc_team"
            [call] = await fake.wait_for(1)
            assert await inbox_keys(srv.runtime) == ["feishu:oc_team"]
    assert (call.kind, call.body["receive_id"], call.text) == ("create", "oc_team", "You said: open room")


async def test_commands_work_after_a_mention_in_groups(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_callback(client, srv.url, fs.group_mention("/help", message_id="om_help"))
            assert resp.status_code == 200, resp.text
            [call] = await fake.wait_for(1)
    assert call.path == "/open-apis/im/v1/messages/om_help/reply"
    assert "/new" in call.text and "/reset" in call.text


async def test_ack_does_not_wait_for_the_agent(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(
                channel_settings={"feishu": feishu_settings(fake)}, provider=OfflineProvider(latency_ms=4000)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            started = time.monotonic()
            resp = await post_callback(client, srv.url, fs.text_event("slow thinking"))
            elapsed = time.monotonic() - started
            assert resp.status_code == 200
            # Well before the model's 4 s (Feishu waits about 3 s); margin for a busy CI.
            assert elapsed < 2.5, elapsed
            assert await count(srv.runtime, inbox) == 1  # committed before the ack
            await fake.wait_for(1)


async def test_a_reply_to_the_bot_in_a_group_addresses_it_without_a_mention(serve: ServeApp) -> None:
    async with FakeFeishu() as fake:
        async with (
            serve(channel_settings={"feishu": feishu_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(client, srv.url, fs.group_mention("first", message_id="om_q1"))
            [answer] = await fake.wait_for(1)
            bot_message = "om_sent0001"
            follow = fs.text_event(
                "and why?", chat_type="group", chat_id="oc_team", parent_id=bot_message, root_id="om_q1"
            )
            resp = await post_callback(client, srv.url, follow)
            assert resp.json()["session_key"] == "feishu:oc_team", resp.text
            # A reply to someone else's message, unmentioned: not for the bot.
            other = fs.text_event("+1", chat_type="group", chat_id="oc_team", parent_id="om_q1")
            assert "ignored" in (await post_callback(client, srv.url, other)).json()
            calls = await fake.wait_for(2)
    assert calls[1].text == "You said: and why?"
    assert [c.path for c in fake.calls_of("get")] == [
        f"/open-apis/im/v1/messages/{bot_message}",
        "/open-apis/im/v1/messages/om_q1",
    ]
    assert answer.ok
