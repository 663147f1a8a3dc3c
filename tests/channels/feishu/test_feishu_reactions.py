"""Feishu reactions end to end (docs/events.md): `im.message.reaction.created_v1` names the
message, not its chat, so the adapter finds where it is (the record of an approval card it
sent, or Feishu's `GET messages/:id` and `GET chats/:id`). ✅ on an approval card by an
approver approves (the tool runs once), by anyone else is refused; other reactions are notes
the model reads; a lookup Feishu cannot answer now is refused with 503 so Feishu sends the
event again. The real app, a fake Feishu Open Platform, the fake OpenAI server; the fake's
reaction events are checked against lark-oapi's event models."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox, runs
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.feishu.support import LARK_OAPI, feishu_settings, post_callback, served_with_tools
from tests.channels.support import count, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.support.timing import eventually

if TYPE_CHECKING:
    from lark_oapi.api.im.v1 import P2ImMessageReactionCreatedV1, P2ImMessageReactionDeletedV1


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


def user_texts(request: Any) -> list[str]:
    return [str(m["content"]) for m in request.messages if m["role"] == "user"]


def _card_message(fake: FakeFeishu) -> str:
    [card] = [m for m, info in fake.messages.items() if info.get("msg_type") == "interactive"]
    return card


async def test_a_check_mark_on_an_approval_card_approves_once_and_other_reactions_are_notes(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model, FakeFeishu() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="off", approvers=["ou_boss"]
        ) as (srv, client):
            await post_callback(client, srv.url, fs.text_event("write r.txt", sender="ou_boss"))
            await fake.wait_for(1, "create")
            await wait_outbox_final(srv.runtime, 1)  # sent, and where the card went recorded
            card = _card_message(fake)

            # Someone who may not approve: refused, nothing runs.
            resp = await post_callback(
                client, srv.url, fs.reaction_event(card, "CheckMark", operator="ou_eve")
            )
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == "feishu:oc_alice"
            await eventually(lambda: any("not allowed" in t for t in fake.texts.values()))
            await wait_inbox_done(srv.runtime)
            assert not (tmp_path / "r.txt").exists()

            approved = fs.reaction_event(card, "CheckMark", operator="ou_boss")
            await post_callback(client, srv.url, approved)
            again = await post_callback(client, srv.url, approved)  # Feishu's redelivery
            assert again.json()["duplicate"] is True
            await eventually(lambda: "Written." in fake.texts.values())
            await wait_inbox_done(srv.runtime)
            # Another ✅ (another event) finds the approval decided: the tool does not run again.
            await post_callback(client, srv.url, fs.reaction_event(card, "DONE", operator="ou_boss"))
            await wait_inbox_done(srv.runtime)
            [written] = [m for m, t in fake.texts.items() if t == "Written."]
            await post_callback(client, srv.url, fs.reaction_event(written, "FIRE", operator="ou_boss"))
            await wait_inbox_done(srv.runtime)
            await post_callback(client, srv.url, fs.text_event("thanks", sender="ou_boss"))
            await eventually(lambda: "echo thanks" in fake.texts.values())
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
                [run, _thanks] = (
                    (await conn.execute(select(runs).order_by(runs.c.started_at))).mappings().all()
                )
    assert (decided["status"], decided["decided_by"]) == ("approved", "ou_boss")
    assert (tmp_path / "r.txt").read_text() == "ok"
    assert [c["decision"] for c in run["tool_calls"]] == ["approved"]  # ran once
    seen = user_texts(model.requests[-1])
    assert seen[-1] == "thanks"
    assert any('reacted with FIRE to your answer "Written."' in t for t in seen)
    # The card's session was known from its record: Feishu was not asked where it is.
    assert not [c for c in fake.calls_of("get") if c.path.endswith(card)]


async def test_a_check_mark_on_the_card_after_a_streamed_prompt_approves(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeFeishu() as fake:
        said = "Sure, I will write that file for you right now, give me a moment please."
        model.enqueue(
            calls(ToolCall("write_file", {"path": "p.txt", "content": "p"}), content=said, chunk_delay=0.15),
            text("Written."),
        )
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="edit", stream_edit_seconds=0.1, approvers=["ou_alice"]
        ) as (srv, client):
            await post_callback(client, srv.url, fs.text_event("write p.txt"))
            await eventually(lambda: any(i.get("msg_type") == "interactive" for i in fake.messages.values()))
            await wait_outbox_final(srv.runtime, 1)
            # The reaction is on the short card; the prompt the outbox knows is the preview.
            await post_callback(client, srv.url, fs.reaction_event(_card_message(fake), "THUMBSUP"))
            await eventually(lambda: "Written." in fake.texts.values())
    assert (tmp_path / "p.txt").read_text() == "p"


async def test_a_reaction_on_a_users_message_is_found_through_feishu_and_becomes_a_note(
    serve: ServeApp,
) -> None:
    async with FakeOpenAI(default=echo) as model, FakeFeishu() as fake:
        fake.p2p_chats.add("oc_alice")
        fake.messages["om_q1"] = {"chat_id": "oc_alice", "sender": "ou_alice"}
        async with (
            serve(
                channel_settings={"feishu": feishu_settings(fake, streaming="off")}, **openai_settings(model)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # A reaction event without a message or an emoji: 400 with the reason, nothing stored.
            malformed = fs.text_event("x", event_type="im.message.reaction.created_v1")
            bad = await post_callback(client, srv.url, malformed)
            assert bad.status_code == 400 and "emoji_type" in bad.json()["detail"]
            await post_callback(client, srv.url, fs.text_event("is it raining?", message_id="om_q1"))
            await fake.wait_for(1, "create")
            await wait_inbox_done(srv.runtime)
            # Feishu cannot say where the message is right now: 503, nothing stored, then again.
            fake.fail("get", fs.SERVER_ERROR)
            reacted = fs.reaction_event("om_q1", "SMILE")
            refused = await post_callback(client, srv.url, reacted)
            assert refused.status_code == 503, refused.text
            assert await count(srv.runtime, inbox) == 1
            resp = await post_callback(client, srv.url, reacted)
            assert resp.status_code == 200, resp.text
            assert resp.json()["session_key"] == "feishu:oc_alice"
            # A reaction by an app (a bot) is no event.
            by_app = await post_callback(
                client, srv.url, fs.reaction_event("om_q1", "OK", operator_type="app")
            )
            assert by_app.json()["ignored"] == "a reaction by an app"
            await wait_inbox_done(srv.runtime)
            await post_callback(client, srv.url, fs.text_event("and tomorrow?"))
            await eventually(lambda: "echo and tomorrow?" in fake.texts.values())
            stored = await count(srv.runtime, inbox)
    seen = user_texts(model.requests[-1])
    assert any('reacted with SMILE to the message "is it raining?"' in t for t in seen)
    assert stored == 3
    assert len(fake.calls_of("chat_info")) == 1  # the chat's type is asked once


@LARK_OAPI
def test_the_fakes_reaction_events_are_what_lark_oapi_reads() -> None:
    import lark_oapi as lark

    created: list[P2ImMessageReactionCreatedV1] = []
    deleted: list[P2ImMessageReactionDeletedV1] = []
    handler = (
        lark.EventDispatcherHandler.builder(fs.ENCRYPT_KEY, fs.VERIFICATION_TOKEN)
        .register_p2_im_message_reaction_created_v1(created.append)
        .register_p2_im_message_reaction_deleted_v1(deleted.append)
        .build()
    )
    for payload in (
        fs.reaction_event("om_1", "CheckMark", operator="ou_boss"),
        fs.reaction_event("om_1", "FIRE", removed=True),
    ):
        body, headers = fs.callback(payload)
        request = lark.RawRequest()
        request.uri, request.headers, request.body = "/channels/feishu", headers, body
        assert handler.do(request).status_code == 200
    [added], [removed] = created, deleted
    assert added.event is not None and removed.event is not None
    assert (added.event.message_id, added.event.operator_type) == ("om_1", "user")
    assert added.event.reaction_type is not None and added.event.reaction_type.emoji_type == "CheckMark"
    assert added.event.user_id is not None and added.event.user_id.open_id == "ou_boss"
    assert removed.event.reaction_type is not None and removed.event.reaction_type.emoji_type == "FIRE"
