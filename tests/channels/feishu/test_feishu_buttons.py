"""Feishu approval buttons end to end (docs/events.md): an approval prompt is an interactive
card with approve / deny buttons; a press (`card.action.trigger`, encrypted and signed like
every event) by a member who may not approve is refused with a toast in the callback's
answer and runs nothing; a press by an approver approves and the tool runs once. The real
app, a fake Feishu Open Platform, the fake OpenAI server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.db.models import approvals
from tests.channels.feishu.support import post_callback, served_with_tools
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.support.timing import eventually


def _buttons(card_call: Any) -> list[dict[str, Any]]:
    card = json.loads(card_call.body["content"])
    [actions] = [e for e in card["elements"] if e["tag"] == "action"]
    return list(actions["actions"])


async def test_an_approval_card_button_approves_and_a_press_by_someone_else_is_refused_with_a_toast(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeFeishu() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="off", approvers=["ou_boss"]
        ) as (srv, client):
            await post_callback(client, srv.url, fs.text_event("write out.txt", sender="ou_boss"))
            [prompt] = await fake.wait_for(1, "create")
            assert prompt.body["msg_type"] == "interactive"
            assert "/approve" in prompt.body["content"]  # the typed command is still named
            approve, deny = _buttons(prompt)
            assert (approve["value"]["action"], deny["value"]["action"]) == ("approve", "deny")
            card_message = "om_sent0001"

            # A member who may not approve: a toast for them alone, nothing in the chat, nothing run.
            press = fs.card_action_event(approve["value"], operator="ou_mallory", message_id=card_message)
            resp = await post_callback(client, srv.url, press)
            assert resp.status_code == 200, resp.text
            toast = resp.json()["toast"]
            assert toast["type"] == "error" and "not allowed" in toast["content"]
            await wait_inbox_done(srv.runtime)
            assert not (tmp_path / "out.txt").exists()
            assert len(fake.calls_of("create", "reply")) == 1  # only the prompt
            # The typed command by the same member is refused by an ordinary reply.
            typed = f"/approve {approve['value']['approval_id']}"
            await post_callback(client, srv.url, fs.text_event(typed, sender="ou_mallory"))
            await eventually(lambda: any("not allowed" in t for t in fake.texts.values()))
            await wait_inbox_done(srv.runtime)
            assert not (tmp_path / "out.txt").exists()

            press = fs.card_action_event(approve["value"], operator="ou_boss", message_id=card_message)
            resp = await post_callback(client, srv.url, press)
            assert resp.status_code == 200, resp.text
            assert "toast" not in resp.json()
            await eventually(lambda: "Written." in fake.texts.values())
            await wait_inbox_done(srv.runtime)
            # A second press (another callback) finds the approval decided: nothing runs again.
            again = fs.card_action_event(approve["value"], operator="ou_boss", message_id=card_message)
            await post_callback(client, srv.url, again)
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (decided["status"], decided["decided_by"]) == ("approved", "ou_boss")
    assert (tmp_path / "out.txt").read_text() == "hi"
    assert list(fake.texts.values()).count("Written.") == 1
    tool_results = [m for r in model.requests for m in r.messages if m["role"] == "tool"]
    assert len(tool_results) == 1


async def test_an_approval_prompt_that_ends_a_streamed_preview_is_followed_by_its_buttons(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeFeishu() as fake:
        said = "Sure, I will write that file for you right now, give me a moment please."
        model.enqueue(
            calls(ToolCall("write_file", {"path": "s.txt", "content": "s"}), content=said, chunk_delay=0.15),
            text("Written."),
        )
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="edit", stream_edit_seconds=0.1, approvers=["ou_alice"]
        ) as (srv, client):
            await post_callback(client, srv.url, fs.text_event("write s.txt"))
            await eventually(
                lambda: any(c.body.get("msg_type") == "interactive" for c in fake.calls_of("create"))
            )
            [preview] = [c for c in fake.calls_of("create") if c.body["msg_type"] == "text"]
            [card] = [c for c in fake.calls_of("create") if c.body["msg_type"] == "interactive"]
            approve, _deny = _buttons(card)
            preview_id = next(iter(fake.texts))
            card_message = next(m for m in fake._sent if m not in fake.texts)
            press = fs.card_action_event(approve["value"], operator="ou_alice", message_id=card_message)
            resp = await post_callback(client, srv.url, press)
            assert "toast" not in resp.json()
            await eventually(lambda: "Written." in fake.texts.values())
    # The preview became the prompt (its last edit); the buttons followed it, and they work.
    assert "/approve" in fake.texts[preview_id]
    assert fake.calls_of("update")
    assert (tmp_path / "s.txt").read_text() == "s"
    assert preview.ok


async def test_a_prompt_longer_than_one_message_is_sent_as_text_then_a_card_with_the_buttons(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeFeishu() as fake:
        content = "😀" * 400  # 4 bytes a character: the prompt outgrows one message
        model.enqueue(calls(ToolCall("write_file", {"path": "l.txt", "content": content})), text("Written."))
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="off", approvers=["ou_alice"], max_message_bytes=1000
        ) as (srv, client):
            await post_callback(client, srv.url, fs.text_event("write l.txt"))
            await eventually(
                lambda: any(c.body.get("msg_type") == "interactive" for c in fake.calls_of("create"))
            )
            sent = fake.calls_of("create")
            card = sent[-1]
            assert card.body["msg_type"] == "interactive" and "Approval #" in card.body["content"]
            assert len(sent) > 2 and all(c.body["msg_type"] == "text" for c in sent[:-1])
            assert "/approve" in "".join(c.text for c in sent[:-1])
            approve, _deny = _buttons(card)
            card_message = next(m for m in fake._sent if m not in fake.texts)
            press = fs.card_action_event(approve["value"], operator="ou_alice", message_id=card_message)
            await post_callback(client, srv.url, press)
            await eventually(lambda: "Written." in fake.texts.values())
    assert (tmp_path / "l.txt").read_text() == content
