"""OneBot v11 end to end: fake bridges on the reverse WebSocket and in HTTP POST mode."""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import inbox, outbox
from app.events import ImagePart, MentionPart, OutboundMessage, TextPart
from channels.onebot import OneBotSettings
from tests.channels.support import count, session_messages
from tests.conftest import ServeApp
from tests.fakes.onebot import (
    FakeBridge,
    FakeHttpApi,
    group_message,
    heartbeat,
    private_message,
    refused_with,
    sign_post,
)
from tests.support.timing import eventually

TOKEN = "onebot-test-token"
SECRET = "onebot-post-secret"
BOT = 10001
OTHER_BOT = 20002


def onebot_settings(**overrides: Any) -> OneBotSettings:
    values: dict[str, Any] = {"access_token": TOKEN, "api_timeout_seconds": 2.0}
    values.update(overrides)
    return OneBotSettings(_env_file=None, **values)  # type: ignore[call-arg]


def ws_url(srv: Any) -> str:
    return srv.url.replace("http://", "ws://") + "/channels/onebot/ws"


async def _outbox_done(runtime: Any, status: str, at_least: int = 1) -> None:
    async def check() -> bool:
        return await count(runtime, outbox, outbox.c.status == status) >= at_least

    await eventually(check, timeout=15)


# --- reverse WebSocket -------------------------------------------------------------------


async def test_private_message_is_answered_through_the_bot_that_received_it(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await bridge.send_event(heartbeat(BOT))  # acknowledged and ignored
        await bridge.send_event(
            private_message(BOT, 42, [{"type": "text", "data": {"text": "hello"}}], message_id=7)
        )
        [action] = await bridge.wait_for_actions(1)
        assert action.action == "send_private_msg"
        assert action.params == {
            "user_id": 42,
            "message": [{"type": "text", "data": {"text": "You said: hello"}}],
        }
        history = await session_messages(client, srv.url, "onebot:private%3A42")
        assert [m["role"] for m in history] == ["user", "assistant"]
        assert history[0]["content"] == "hello"
        await _outbox_done(srv.runtime, "sent")
        async with srv.runtime.engine.connect() as conn:
            row = (await conn.execute(select(inbox.c.external_id))).one()
        assert row.external_id == f"{BOT}:7"


async def test_cq_string_group_mention_is_parsed_unescaped_and_answered_with_a_quote(
    serve: ServeApp,
) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        httpx.AsyncClient(timeout=30) as client,
    ):
        cq = f"[CQ:at,qq={BOT}] look &#91;x&#93; &amp; y[CQ:image,file=a.jpg,url=https://img.example/a.jpg]"
        await bridge.send_event(group_message(BOT, 555, 42, cq, message_id=99))
        [action] = await bridge.wait_for_actions(1)
        assert action.action == "send_group_msg"
        assert action.params["group_id"] == 555
        assert action.params["message"] == [
            {"type": "reply", "data": {"id": "99"}},
            {"type": "text", "data": {"text": "You said: look [x] & y"}},
        ]
        [user, *_] = await session_messages(client, srv.url, "onebot:group%3A555")
        assert user["content"] == "look [x] & y"


async def test_group_messages_not_addressed_to_the_bot_are_ignored(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        httpx.AsyncClient(timeout=30) as client,
    ):
        await bridge.send_event(group_message(BOT, 555, 42, "just chatting"))
        await bridge.send_event(group_message(BOT, 555, 43, f"[CQ:at,qq={OTHER_BOT}] not you"))
        await bridge.send_event(
            group_message(BOT, 555, 42, [{"type": "at", "data": {"qq": str(BOT)}}, _text(" now you")])
        )
        [first] = await bridge.wait_for_actions(1)
        assert first.params["message"][-1] == _text("You said: now you")
        # A reply to the bot's own message addresses it too, without an @.
        bot_message_id = bridge.sent_ids[0]
        await bridge.send_event(
            group_message(
                BOT, 555, 43, [{"type": "reply", "data": {"id": str(bot_message_id)}}, _text("thanks")]
            )
        )
        actions = await bridge.wait_for_actions(2)
        assert actions[1].params["message"][-1] == _text("You said: thanks")
        # A later addressed message in the same group is the barrier: anything the earlier
        # ones could still cause in this conversation comes before its answer.
        await bridge.send_event(group_message(BOT, 555, 42, f"[CQ:at,qq={BOT}] barrier"))
        actions = await bridge.wait_for_actions(3)
        assert [a.params["message"][-1] for a in actions][2:] == [_text("You said: barrier")]
        assert len(bridge.actions) == 3
        history = await session_messages(client, srv.url, "onebot:group%3A555")
        users = [m["content"] for m in history if m["role"] == "user"]
        assert users == ["now you", "thanks", "barrier"]
        assert await count(srv.runtime, inbox) == 3  # the others were not stored


async def test_without_mention_gating_every_group_message_is_answered(serve: ServeApp) -> None:
    settings = onebot_settings(require_mention_in_groups=False)
    async with (
        serve(channel_settings={"onebot": settings}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
    ):
        await bridge.send_event(group_message(BOT, 555, 42, "anyone?"))
        [action] = await bridge.wait_for_actions(1)
        assert action.params["message"][-1] == _text("You said: anyone?")


async def test_user_in_chat_scope_gives_each_group_member_a_session(serve: ServeApp) -> None:
    settings = onebot_settings(session_scope="user_in_chat")
    async with (
        serve(channel_settings={"onebot": settings}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
        httpx.AsyncClient(timeout=30) as client,
    ):
        at = f"[CQ:at,qq={BOT}]"
        await bridge.send_event(group_message(BOT, 555, 42, at + "I like tea"))
        await bridge.send_event(group_message(BOT, 555, 43, at + "I like coffee"))
        actions = await bridge.wait_for_actions(2)
        assert {a.params["group_id"] for a in actions} == {555}
        alice = await session_messages(client, srv.url, "onebot:group%3A555:user:42")
        bob = await session_messages(client, srv.url, "onebot:group%3A555:user:43")
        assert [m["content"] for m in alice if m["role"] == "user"] == ["I like tea"]
        assert [m["content"] for m in bob if m["role"] == "user"] == ["I like coffee"]


async def test_two_bots_connected_at_once_each_answer_their_own_users(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as first,
        FakeBridge(ws_url(srv), OTHER_BOT, TOKEN, token_in_query=True) as second,
    ):
        await first.send_event(private_message(BOT, 42, "to the first bot"))
        await second.send_event(private_message(OTHER_BOT, 43, "to the second bot"))
        [a] = await first.wait_for_actions(1)
        [b] = await second.wait_for_actions(1)
        assert (a.params["user_id"], a.params["message"]) == (42, [_text("You said: to the first bot")])
        assert (b.params["user_id"], b.params["message"]) == (43, [_text("You said: to the second bot")])
        # Barriers: a second message to each bot; neither bot got the other's answers.
        await first.send_event(private_message(BOT, 42, "first again"))
        await second.send_event(private_message(OTHER_BOT, 43, "second again"))
        await first.wait_for_actions(2)
        await second.wait_for_actions(2)
        assert [a.params["message"] for a in first.actions] == [
            [_text("You said: to the first bot")],
            [_text("You said: first again")],
        ]
        assert [a.params["message"] for a in second.actions] == [
            [_text("You said: to the second bot")],
            [_text("You said: second again")],
        ]


async def test_separate_event_and_api_sockets_of_one_bot(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN, role="API") as api,
        FakeBridge(ws_url(srv), BOT, TOKEN, role="Event") as events,
    ):
        await events.send_event(private_message(BOT, 42, "split roles"))
        [action] = await api.wait_for_actions(1)
        assert action.params["message"] == [_text("You said: split roles")]
        assert events.actions == []


async def test_a_redelivered_event_is_processed_once(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
    ):
        event = private_message(BOT, 42, "once", message_id=31)
        for _ in range(3):
            await bridge.send_event(event)
        await bridge.wait_for_actions(1)
        # A later message in the same chat is the barrier: a duplicate would be answered first.
        await bridge.send_event(private_message(BOT, 42, "barrier", message_id=32))
        actions = await bridge.wait_for_actions(2)
        assert [a.params["message"] for a in actions] == [
            [_text("You said: once")],
            [_text("You said: barrier")],
        ]
        assert await count(srv.runtime, inbox) == 2


async def test_bad_frames_are_ignored_and_a_reconnecting_bridge_replaces_the_old_socket(
    serve: ServeApp,
) -> None:
    async with serve(channel_settings={"onebot": onebot_settings()}) as srv:
        adapter = srv.runtime.adapters["onebot"]
        async with FakeBridge(ws_url(srv), BOT, TOKEN) as old:
            await old.send_raw("this is not json")
            await old.send_raw("[1, 2]")
            await old.send_raw(json.dumps({"echo": "nobody-waits", "status": "ok", "retcode": 0}))
            await old.send_event(private_message(BOT, 42, "still there?"))
            await old.wait_for_actions(1)
            async with FakeBridge(ws_url(srv), BOT, TOKEN) as new:
                assert await old.wait_closed() == 4000  # replaced
                await new.send_event(private_message(BOT, 42, "after reconnect"))
                [action] = await new.wait_for_actions(1)
                assert action.params["message"] == [_text("You said: after reconnect")]
                assert adapter.connected_bots == [str(BOT)]
        assert len(old.actions) == 1


async def test_bridges_without_the_right_token_are_refused_with_a_close_code(serve: ServeApp) -> None:
    async with serve(channel_settings={"onebot": onebot_settings()}) as srv:
        url = ws_url(srv)
        self_id = {"X-Self-ID": str(BOT), "X-Client-Role": "Universal"}
        cases = [
            ("no token", self_id, 4401),
            ("wrong token", {**self_id, "Authorization": "Bearer nope"}, 4401),
            ("no self id", {"Authorization": f"Bearer {TOKEN}", "X-Client-Role": "Universal"}, 4400),
        ]
        for reason, headers, code in cases:
            got, detail = await refused_with(url, headers)
            assert got == code, (reason, got, detail)
            assert detail, reason
        got, _ = await refused_with(
            url.replace("/ws", "/elsewhere"), {**self_id, "Authorization": f"Bearer {TOKEN}"}
        )
        assert got == 4404
        assert srv.runtime.adapters["onebot"].connected_bots == []
        assert await count(srv.runtime, inbox) == 0
        # ... and a bridge with the token still gets in.
        async with FakeBridge(url, BOT, TOKEN) as bridge:
            await bridge.send_event(private_message(BOT, 42, "hi"))
            await bridge.wait_for_actions(1)


async def test_without_an_access_token_setting_no_bridge_may_connect(serve: ServeApp) -> None:
    async with serve(channel_settings={"onebot": onebot_settings(access_token=None)}) as srv:
        got, detail = await refused_with(
            ws_url(srv), {"X-Self-ID": str(BOT), "Authorization": "Bearer anything"}
        )
        assert got == 4503
        assert "ONEBOT_ACCESS_TOKEN" in detail


async def test_a_failing_bridge_is_retried_then_the_reply_is_recorded_as_failed(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}, outbox_max_attempts=3) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN, mode="fail") as bridge,
    ):
        await bridge.send_event(private_message(BOT, 42, "hello"))
        await _outbox_done(srv.runtime, "failed")
        assert len(bridge.actions) == 3
        async with srv.runtime.engine.connect() as conn:
            row = (await conn.execute(select(outbox.c.attempts, outbox.c.last_error))).one()
        assert row.attempts == 3
        assert "retcode 200" in row.last_error


async def test_a_retried_split_reply_sends_only_the_missing_part(serve: ServeApp) -> None:
    settings = onebot_settings(max_text_chars=10)
    async with (
        serve(channel_settings={"onebot": settings}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN, fail_at=frozenset({2})) as bridge,
    ):
        await bridge.send_event(private_message(BOT, 42, "0123456789"))  # "You said: 0123456789"
        await _outbox_done(srv.runtime, "sent")
        texts = [a.params["message"][0]["data"]["text"] for a in bridge.actions]
        assert texts == ["You said: ", "0123456789", "0123456789"]  # the 2nd failed once, 1st not resent


async def test_a_silent_bridge_times_out_and_is_retried(serve: ServeApp) -> None:
    settings = onebot_settings(api_timeout_seconds=0.3)
    async with (
        serve(channel_settings={"onebot": settings}, outbox_max_attempts=2) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN, mode="silent") as bridge,
    ):
        await bridge.send_event(private_message(BOT, 42, "hello"))
        await _outbox_done(srv.runtime, "failed")
        assert len(bridge.actions) == 2
        async with srv.runtime.engine.connect() as conn:
            error = (await conn.execute(select(outbox.c.last_error))).scalar_one()
        assert "did not answer" in error


async def test_answers_without_a_bot_of_origin_use_the_only_bot_and_long_text_is_split(
    serve: ServeApp,
) -> None:
    settings = onebot_settings(max_text_chars=10)
    async with (
        serve(channel_settings={"onebot": settings}) as srv,
        FakeBridge(ws_url(srv), BOT, TOKEN) as bridge,
    ):
        adapter = srv.runtime.adapters["onebot"]

        async def connected() -> bool:
            return bool(adapter.connected_bots == [str(BOT)])

        await eventually(connected, timeout=15)
        # Like a cron job's reply: no reply_self_id, so the only connected bot sends it.
        answer = OutboundMessage(
            channel="onebot",
            chat_id="group:555",
            parts=(
                TextPart(text="0123456789abcdefghij!"),
                ImagePart(url="https://img.example/c.png"),
                MentionPart(user_id="42"),
            ),
            metadata={"reply_message_id": "5"},
        )
        result = await adapter.send(answer)
        assert [a.params["message"] for a in bridge.actions] == [
            [{"type": "reply", "data": {"id": "5"}}, _text("0123456789")],
            [_text("abcdefghij")],
            [
                _text("!"),
                {"type": "image", "data": {"file": "https://img.example/c.png"}},
                {"type": "at", "data": {"qq": "42"}},
            ],
        ]
        assert result.platform_message_id == str(bridge.sent_ids[-1])


# --- HTTP POST mode ----------------------------------------------------------------------


async def _post(client: httpx.AsyncClient, srv: Any, event: dict[str, Any], **headers: str) -> httpx.Response:
    body = json.dumps(event).encode()
    base = {"Content-Type": "application/json", "X-Self-ID": str(event["self_id"])}
    if "sign" in headers:
        base["X-Signature"] = sign_post(headers.pop("sign"), body)
    return await client.post(f"{srv.url}/channels/onebot", content=body, headers={**base, **headers})


async def test_http_post_mode_signed_event_is_answered_through_the_http_api(serve: ServeApp) -> None:
    async with FakeHttpApi(TOKEN, fail_first=1) as api:
        settings = onebot_settings(secret=SECRET, http_api_url=api.url)
        async with (
            serve(channel_settings={"onebot": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await _post(client, srv, private_message(BOT, 42, "via http", message_id=3), sign=SECRET)
            assert resp.status_code == 204, resp.text
            assert (await _post(client, srv, heartbeat(BOT), sign=SECRET)).status_code == 204
            [call] = await api.wait_for(1)
            assert api.attempts == 2  # the first answer was a 500: retried
            assert call.action == "send_private_msg"
            assert call.headers["Authorization"] == f"Bearer {TOKEN}"
            assert call.params == {"user_id": 42, "message": [_text("You said: via http")]}
            # The same report again (the bridge retried): stored once.
            again = await _post(client, srv, private_message(BOT, 42, "via http", message_id=3), sign=SECRET)
            assert again.status_code == 204
            # The redelivery's answer came after its storage decision; a later report in
            # the same chat is the barrier for any duplicate answer.
            barrier = private_message(BOT, 42, "barrier", message_id=4)
            assert (await _post(client, srv, barrier, sign=SECRET)).status_code == 204
            calls = await api.wait_for(2)
            assert [c.params["message"] for c in calls] == [
                [_text("You said: via http")],
                [_text("You said: barrier")],
            ]
            assert await count(srv.runtime, inbox) == 2


async def test_http_post_mode_refuses_forged_and_unsigned_reports(serve: ServeApp) -> None:
    settings = onebot_settings(secret=SECRET)
    async with (
        serve(channel_settings={"onebot": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        event = private_message(BOT, 42, "forged")
        cases = [
            ("unsigned", {}, 401),
            ("wrong secret", {"sign": "not-the-secret"}, 401),
            ("bad format", {"X-Signature": "md5=abc"}, 401),
        ]
        for reason, headers, status in cases:
            resp = await _post(client, srv, event, **headers)
            assert resp.status_code == status, (reason, resp.text)
            assert resp.json()["detail"], reason
        body = json.dumps(event).encode()
        tampered = await client.post(
            f"{srv.url}/channels/onebot",
            content=body.replace(b"forged", b"FORGED"),
            headers={
                "Content-Type": "application/json",
                "X-Self-ID": str(BOT),
                "X-Signature": sign_post(SECRET, body),
            },
        )
        assert tampered.status_code == 401
        no_self_id = await client.post(
            f"{srv.url}/channels/onebot",
            content=body,
            headers={"Content-Type": "application/json", "X-Signature": sign_post(SECRET, body)},
        )
        assert no_self_id.status_code == 400
        assert await count(srv.runtime, inbox) == 0
        ok = await _post(client, srv, event, sign=SECRET)
        assert ok.status_code == 204


async def test_no_bot_and_no_http_api_means_retries_then_failed(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"onebot": onebot_settings()}, outbox_max_attempts=3) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv, private_message(BOT, 42, "anyone there?"))
        assert resp.status_code == 204
        await _outbox_done(srv.runtime, "failed")
        async with srv.runtime.engine.connect() as conn:
            row = (await conn.execute(select(outbox.c.attempts, outbox.c.last_error))).one()
        assert row.attempts == 3
        assert "no OneBot connection" in row.last_error


async def test_http_api_outage_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with FakeHttpApi(TOKEN, fail_first=-1) as api:
        settings = onebot_settings(http_api_url=api.url)
        async with (
            serve(channel_settings={"onebot": settings}, outbox_max_attempts=3) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, private_message(BOT, 42, "hello"))
            await _outbox_done(srv.runtime, "failed")
            assert api.attempts == 3


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "data": {"text": text}}
