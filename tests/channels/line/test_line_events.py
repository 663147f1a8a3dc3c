"""LINE's platform-native events end to end (docs/events.md): `unsend` withdraws a message,
`memberJoined` / `memberLeft` greet and say goodbye when the texts are set, and approval
prompts carry a confirm template whose postback presses decide them (or are refused,
privately, for a member who may not decide).

The official SDK (`linebot.v3`) sends to the fake Messaging API; webhooks are signed here
by the published rule (base64 HMAC-SHA256 of the body with the channel secret).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.line.test_line import GROUP, USER, line_settings
from tests.channels.support import count, settled_outbox, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes.line import (
    SECRET,
    FakeLine,
    message_event,
    native_event,
    signed_headers,
    text_message,
    webhook_body,
)
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.support.timing import eventually

BOSS = "Ub0550000000000000000000000000001"
INTRUDER = "U1d7a0000000000000000000000000002"


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def _post(client: httpx.AsyncClient, srv: Any, *events: dict[str, Any]) -> httpx.Response:
    body = webhook_body(*events)
    return await client.post(f"{srv.url}/channels/line", content=body, headers=signed_headers(SECRET, body))

    return SECRET


def _user_texts(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


async def test_an_approval_prompt_has_buttons_a_press_decides_and_an_intruder_is_told_privately(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeLine() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        settings = line_settings(fake, approvers=[BOSS])
        async with (
            serve(
                channel_settings={"line": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            asked = message_event(
                text_message("write out.txt", mention_bot=True),
                user=BOSS,
                group=GROUP,
                reply_token=fake.reply_token(),
            )
            assert (await _post(client, srv, asked)).status_code == 200
            [prompt] = await fake.wait_for(1)
            *texts, confirm = prompt.body["messages"]
            assert any("/approve" in m["text"] for m in texts)
            assert confirm["type"] == "template" and confirm["template"]["type"] == "confirm"
            approve, deny = (a["data"] for a in confirm["template"]["actions"])
            assert approve.startswith("approve:") and deny == f"deny:{approve.partition(':')[2]}"
            await settled_outbox(srv.runtime)

            # Someone who may not approve: a push to their own chat with the bot, not the group.
            press: dict[str, Any] = {"postback": {"data": approve}}
            refused = native_event(
                "postback", user=INTRUDER, group=GROUP, reply_token=fake.reply_token(), **press
            )
            assert (await _post(client, srv, refused)).status_code == 200
            [_, notice] = await fake.wait_for(2)
            await wait_inbox_done(srv.runtime)
            assert notice.path == "/v2/bot/message/push" and notice.body["to"] == INTRUDER
            assert "not allowed" in notice.body["messages"][0]["text"]
            assert not (tmp_path / "out.txt").exists()

            pressed = native_event(
                "postback", user=BOSS, group=GROUP, reply_token=fake.reply_token(), **press
            )
            assert (await _post(client, srv, pressed)).status_code == 200
            again = {**pressed, "deliveryContext": {"isRedelivery": True}}  # redelivered: stored once
            assert (await _post(client, srv, again)).status_code == 200
            await eventually(lambda: "Written." in fake.texts())
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
            assert await count(srv.runtime, inbox) == 3
    assert (decided["status"], decided["decided_by"]) == ("approved", BOSS)
    assert (tmp_path / "out.txt").read_text() == "hi"
    assert not any(s.body.get("to") == GROUP and "not allowed" in str(s.body) for s in fake.sent)


async def test_an_unsent_message_is_withdrawn_from_the_history_and_our_answer_stays(serve: ServeApp) -> None:
    async with FakeOpenAI(default=echo) as model, FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            secret = text_message("my pin is 1234")
            first = message_event(secret, user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, first)).status_code == 200
            await fake.wait_for(1)
            await settled_outbox(srv.runtime)
            unsent = native_event("unsend", user=USER, unsend={"messageId": secret["id"]})
            assert (await _post(client, srv, unsent)).status_code == 200
            await wait_inbox_done(srv.runtime)
            later = message_event(text_message("hello again"), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, later)).status_code == 200
            await eventually(lambda: "echo hello again" in fake.texts())
    seen = _user_texts(model.requests[-1])
    assert seen[-1] == "hello again"
    assert not any("1234" in t for t in seen)
    assert any("recalled an earlier message" in t for t in seen)
    # LINE cannot delete the bot's messages: nothing but the two answers was sent.
    assert fake.texts() == ["echo my pin is 1234", "echo hello again"]


async def test_an_unsend_of_a_queued_message_means_it_is_not_answered(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI(default=echo) as model, FakeLine() as fake:
        model.enqueue(text("echo first", hold=hold))
        async with (
            serve(channel_settings={"line": line_settings(fake)}, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            first = message_event(text_message("first"), user=USER, reply_token=fake.reply_token())
            assert (await _post(client, srv, first)).status_code == 200
            await model.wait_requests(1)
            queued = text_message("oops, wrong chat")
            second = message_event(queued, user=USER, reply_token=fake.reply_token())
            unsent = native_event("unsend", user=USER, unsend={"messageId": queued["id"]})
            assert (await _post(client, srv, second, unsent)).status_code == 200
            hold.set()
            await wait_inbox_done(srv.runtime)
            await settled_outbox(srv.runtime)
    assert fake.texts() == ["echo first"]
    assert len(model.requests) == 1


async def test_members_joining_and_leaving_a_group_get_the_welcome_and_farewell(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        fake.members[(GROUP, BOSS)] = "Boss"  # INTRUDER shares no profile: named by user id
        settings = line_settings(fake, welcome_text="Welcome, {name}!", farewell_text="Bye, {name}.")
        async with serve(channel_settings={"line": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            members = {"members": [{"type": "user", "userId": BOSS}, {"type": "user", "userId": INTRUDER}]}
            token = fake.reply_token()
            joined = native_event("memberJoined", user=None, group=GROUP, reply_token=token, joined=members)
            assert (await _post(client, srv, joined)).status_code == 200
            left = native_event(
                "memberLeft", user=None, group=GROUP, left={"members": [{"type": "user", "userId": INTRUDER}]}
            )
            assert (await _post(client, srv, left)).status_code == 200
            await wait_inbox_done(srv.runtime)
            rows = await settled_outbox(srv.runtime)
            assert await count(srv.runtime, inbox) == 3  # one event per member named
    assert {r.status for r in rows} == {"sent"}
    assert sorted(fake.texts()) == sorted(["Welcome, Boss!", f"Welcome, {INTRUDER}!", f"Bye, {INTRUDER}."])
    assert fake.refused == [("/v2/bot/group/" + GROUP + "/member/" + INTRUDER, 404)]
    assert fake.sent[0].path == "/v2/bot/message/reply" and fake.sent[0].body["replyToken"] == token
    assert all(s.body.get("to", GROUP) == GROUP for s in fake.sent)


async def test_member_events_without_texts_and_a_bad_native_event(serve: ServeApp) -> None:
    async with FakeLine() as fake:
        async with (
            serve(channel_settings={"line": line_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            members = {"members": [{"type": "user", "userId": BOSS}]}
            joined = native_event("memberJoined", user=None, group=GROUP, reply_token="rt", joined=members)
            assert (await _post(client, srv, joined)).status_code == 200
            bad = native_event("unsend", user=USER, unsend={"messageId": "1"})
            bad["source"] = {"type": "satellite"}
            resp = await _post(client, srv, bad)
            assert resp.status_code == 400 and "source" in resp.text
            await wait_inbox_done(srv.runtime)  # the join was handled, and said nothing
            assert await count(srv.runtime, inbox) == 1
    assert fake.sent == []  # no welcome text: nothing said
