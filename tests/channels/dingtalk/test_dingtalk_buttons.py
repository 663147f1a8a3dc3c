"""DingTalk approval buttons end to end (docs/events.md): with an approval card template and
Stream mode, an approval prompt is a card (`createAndDeliver`) whose buttons come back as
card callbacks over the Stream connection; a press by a member who may not approve is
refused to them alone (a one-to-one robot message) and runs nothing; a press by an approver
approves and the tool runs once. Without a template the prompt is text and the typed
command decides. The real app, the fake DingTalk (Stream and OpenAPI) with the official
`dingtalk-stream` SDK inside the app, the fake OpenAI server."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import select

from app.db.models import approvals
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.dingtalk.support import dingtalk_settings
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import Call, FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.support.timing import eventually

TEMPLATE = "tpl-approval-buttons.schema"


def _text(call: Call) -> str:
    return str(json.loads(call.body["msgParam"]).get("content"))


async def test_an_approval_card_button_approves_and_a_press_by_someone_else_is_refused_privately(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeDingTalk() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        settings = dingtalk_settings(
            fake, mode="stream", approvers=["staff-boss"], approval_card_template_id=TEMPLATE
        )
        async with serve(
            channel_settings={"dingtalk": settings}, **openai_settings(model, workspace_root=str(tmp_path))
        ) as srv:
            await fake.wait_for_socket()
            message = dt.robot_message("write out.txt", group=True, staff_id="staff-boss")
            await fake.wait_for_ack(await fake.push_callback(message))
            await fake.wait_for(lambda: bool(fake.cards))
            [(track_id, card)] = fake.cards.items()
            assert card.template == TEMPLATE and card.space == "dtv1.card//IM_GROUP.cidGROUP001=="
            assert "/approve" in card.params["content"]  # the typed command is still named
            approval_id = card.params["approval_id"]
            assert approval_id.isdigit()

            # A member who may not approve: told alone (one to one), nothing in the chat, nothing run.
            press = dt.card_callback(track_id, "staff-mallory", "approve")
            ack = await fake.wait_for_ack(await fake.push_callback(press, topic=dt.CARD_TOPIC))
            assert ack["code"] == 200
            await fake.wait_for(lambda: bool(fake.calls_of(dt.SINGLE_SEND)))
            [notice] = fake.calls_of(dt.SINGLE_SEND)
            assert notice.body["userIds"] == ["staff-mallory"] and "not allowed" in _text(notice)
            await wait_inbox_done(srv.runtime)
            assert not (tmp_path / "out.txt").exists()
            assert not fake.calls_of(dt.GROUP_SEND)

            # An approver's press approves: the tool runs, the answer comes in the group.
            press = dt.card_callback(track_id, "staff-boss", "approve")
            await fake.wait_for_ack(await fake.push_callback(press, topic=dt.CARD_TOPIC))
            await eventually(lambda: any(_text(c) == "Written." for c in fake.calls_of(dt.GROUP_SEND)))
            await wait_inbox_done(srv.runtime)
            # The same press delivered again (a redelivery, a double tap): stored once, nothing runs.
            await fake.wait_for_ack(await fake.push_callback(press, topic=dt.CARD_TOPIC))
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    [opened] = fake.calls_of(dt.OPEN_PATH)
    assert {s["topic"] for s in opened.body["subscriptions"]} == {dt.ROBOT_TOPIC, dt.CARD_TOPIC}
    assert (str(decided["id"]), decided["status"], decided["decided_by"]) == (
        approval_id,
        "approved",
        "staff-boss",
    )
    assert (tmp_path / "out.txt").read_text() == "hi"
    assert [_text(c) for c in fake.calls_of(dt.GROUP_SEND)] == ["Written."]
    assert len(fake.calls_of(dt.SINGLE_SEND)) == 1
    tool_results = [m for r in model.requests for m in r.messages if m["role"] == "tool"]
    assert len(tool_results) == 1


async def test_a_deny_press_denies_and_without_a_template_the_prompt_is_text(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeDingTalk() as fake:
        model.enqueue(
            calls(ToolCall("write_file", {"path": "a.txt", "content": "a"})),
            text("Not written."),
            calls(ToolCall("write_file", {"path": "b.txt", "content": "b"})),
            text("Written b."),
        )
        with_cards = dingtalk_settings(
            fake, mode="stream", approvers=["staff-alice"], approval_card_template_id=TEMPLATE
        )
        async with serve(
            channel_settings={"dingtalk": with_cards}, **openai_settings(model, workspace_root=str(tmp_path))
        ) as srv:
            await fake.wait_for_socket()
            await fake.wait_for_ack(await fake.push_callback(dt.robot_message("write a.txt")))
            await fake.wait_for(lambda: bool(fake.cards))
            [(track_id, card)] = fake.cards.items()
            assert card.space == "dtv1.card//IM_ROBOT.staff-alice"  # a one-to-one chat
            press = dt.card_callback(track_id, "staff-alice", "deny")
            await fake.wait_for_ack(await fake.push_callback(press, topic=dt.CARD_TOPIC))
            await eventually(lambda: any(_text(c) == "Not written." for c in fake.calls_of(dt.SINGLE_SEND)))
            await wait_inbox_done(srv.runtime)
        assert not (tmp_path / "a.txt").exists()

        # No template: the prompt is an ordinary message naming the typed command, no card.
        plain = dingtalk_settings(fake, mode="stream", approvers=["staff-alice"])
        async with serve(
            channel_settings={"dingtalk": plain}, **openai_settings(model, workspace_root=str(tmp_path))
        ) as srv:
            await fake.wait_for(lambda: len(fake.tickets_used) == 2 and fake.connected == 1)
            await fake.wait_for_ack(await fake.push_callback(dt.robot_message("write b.txt")))
            await eventually(lambda: any("/approve" in _text(c) for c in fake.calls_of(dt.SINGLE_SEND)))
            [prompt] = [c for c in fake.calls_of(dt.SINGLE_SEND) if "/approve" in _text(c)]
            typed = "/approve " + _text(prompt).split("/approve ")[1].split()[0]
            await fake.wait_for_ack(await fake.push_callback(dt.robot_message(typed)))
            await eventually(lambda: any(_text(c) == "Written b." for c in fake.calls_of(dt.SINGLE_SEND)))
    assert len(fake.cards) == 1  # only the first server's
    assert fake.calls_of(dt.OPEN_PATH)[-1].body["subscriptions"] == [
        {"type": "CALLBACK", "topic": dt.ROBOT_TOPIC}
    ]
    assert (tmp_path / "b.txt").read_text() == "b"


async def test_an_approval_prompt_that_ends_a_streamed_card_is_followed_by_its_buttons(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeDingTalk() as fake:
        said = "Sure, I will write that file for you right now, give me a moment please."
        model.enqueue(
            calls(ToolCall("write_file", {"path": "s.txt", "content": "s"}), content=said, chunk_delay=0.15),
            text("Written."),
        )
        settings = dingtalk_settings(
            fake,
            mode="stream",
            approvers=["staff-alice"],
            approval_card_template_id=TEMPLATE,
            streaming="native",
            card_template_id="tpl-ai-card.schema",
            stream_edit_seconds=0.1,
        )
        async with serve(
            channel_settings={"dingtalk": settings},
            stream_first_preview_seconds=0.2,
            **openai_settings(model, workspace_root=str(tmp_path)),
        ) as srv:
            await fake.wait_for_socket()
            await fake.wait_for_ack(await fake.push_callback(dt.robot_message("write s.txt", group=True)))
            await fake.wait_for(lambda: any(c.template == TEMPLATE for c in fake.cards.values()))
            [(track_id, buttons)] = [(k, c) for k, c in fake.cards.items() if c.template == TEMPLATE]
            [ai_card] = [c for c in fake.cards.values() if c.template != TEMPLATE]
            press = dt.card_callback(track_id, "staff-alice", "approve")
            await fake.wait_for_ack(await fake.push_callback(press, topic=dt.CARD_TOPIC))
            await eventually(lambda: (tmp_path / "s.txt").exists())
            await wait_inbox_done(srv.runtime)
    # The streamed card became the prompt (its last update); the buttons' card followed it.
    assert "/approve" in ai_card.params["content"] and ai_card.finalized
    assert buttons.params["content"] == f"Approval #{buttons.params['approval_id']}"
    assert (tmp_path / "s.txt").read_text() == "s"
