"""WeCom template card presses end to end (docs/events.md): with `WECOM_APPROVAL_BUTTONS` an
approval prompt is followed by a `button_interaction` card (Approve / Deny); a press
(`template_card_event`, signed and encrypted by the test's own WeCom) by an approver
approves, a press redelivered or repeated is stored once, another key is a note for the
model. The real app against the fake WeCom API."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, inbox
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count, settled_outbox, wait_inbox_done
from tests.channels.wecom.test_wecom import _post, api, wecom, wecom_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.fakes.wecom import FakeWeComApi, WeComCallbacks
from tests.support.timing import eventually

__all__ = ["api", "wecom"]  # the fixtures, shared with test_wecom

USER = "zhangsan"


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def test_an_approve_press_on_the_card_approves(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = wecom_settings(api, approval_buttons=True, approvers=[USER])
        async with (
            serve(
                channel_settings={"wecom": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await _post(client, srv.url, wecom.post(wecom.text(USER, "write r.txt", 9001)))
            assert resp.status_code == 200, resp.text
            prompt, card_call = await api.wait_for_sent(2)
            assert prompt.body["msgtype"] == "text" and "/approve" in prompt.body["text"]["content"]
            assert (card_call.body["msgtype"], card_call.body["touser"]) == ("template_card", USER)
            card = card_call.body["template_card"]
            approve, deny = card["button_list"]
            assert card["card_type"] == "button_interaction"
            assert approve["key"].startswith("approve:") and deny["key"] == "deny:" + approve["key"][8:]
            assert card["main_title"]["title"] == "Approval #" + approve["key"][8:]

            now = int(time.time())
            press = wecom.card_event(USER, approve["key"], card["task_id"], create_time=now)
            again = wecom.card_event(USER, approve["key"], card["task_id"], create_time=now + 3)
            for callback in (press, press, again):
                # WeCom's retry of the same press, then the member pressing again.
                resp = await _post(client, srv.url, wecom.post(callback))
                assert resp.status_code == 200, resp.text
                assert resp.content == b""

            async def written() -> bool:
                return any(c.body.get("text", {}).get("content") == "Written." for c in api.sent)

            await eventually(written, timeout=20, message="the approved tool call did not finish")
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (tmp_path / "r.txt").read_text() == "ok"
    assert (decided["status"], decided["decided_by"]) == ("approved", USER)
    assert stored == 2  # the message and one press


async def test_a_deny_press_by_someone_else_is_refused(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})), text("Written."))
        settings = wecom_settings(api, approval_buttons=True, approvers=["boss"])
        async with (
            serve(
                channel_settings={"wecom": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv.url, wecom.post(wecom.text(USER, "write r.txt", 9101)))
            _, card_call = await api.wait_for_sent(2)
            card = card_call.body["template_card"]
            deny = card["button_list"][1]["key"]
            await _post(client, srv.url, wecom.post(wecom.card_event(USER, deny, card["task_id"])))
            sent = await api.wait_for_sent(3)
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [pending] = (await conn.execute(select(approvals))).mappings().all()
    assert pending["status"] == "pending"  # not an approver: nothing decided
    assert sent[2].body["touser"] == USER
    assert sent[2].body["text"]["content"] == "You are not allowed to decide this approval."
    assert not (tmp_path / "r.txt").exists()


async def test_other_keys_are_notes_and_without_the_setting_there_is_no_card(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})))
        async with (
            serve(
                channel_settings={"wecom": wecom_settings(api, approvers=[USER])},
                **openai_settings(model, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv.url, wecom.post(wecom.text(USER, "write r.txt", 9201)))
            [prompt] = await api.wait_for_sent(1)
            await _post(client, srv.url, wecom.post(wecom.card_event(USER, "more-info", "task-x")))
            # A press without a key is acknowledged and not stored.
            await _post(client, srv.url, wecom.post(wecom.card_event(USER, "", "task-y")))
            await wait_inbox_done(srv.runtime)
            stored = await count(srv.runtime, inbox)
            await _post(client, srv.url, wecom.post(wecom.text(USER, "and now?", 9202)))
            await api.wait_for_sent(2)
    assert prompt.body["msgtype"] == "text" and "/approve" in prompt.body["text"]["content"]
    assert all(c.body["msgtype"] == "text" for c in api.sent)  # no card without the setting
    assert stored == 2  # the message and the "more-info" press
    assert 'pressed the button "more-info"' in str(model.requests[-1].messages)


async def test_a_refused_card_leaves_the_text_prompt(
    serve: ServeApp, api: FakeWeComApi, wecom: WeComCallbacks, tmp_path: Path
) -> None:
    api.refuse_template_cards = True
    async with FakeOpenAI(default=echo) as model:
        model.enqueue(calls(ToolCall("write_file", {"path": "r.txt", "content": "ok"})))
        settings = wecom_settings(api, approval_buttons=True, approvers=[USER])
        async with (
            serve(
                channel_settings={"wecom": settings}, **openai_settings(model, workspace_root=str(tmp_path))
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv.url, wecom.post(wecom.text(USER, "write r.txt", 9301)))
            [prompt] = await api.wait_for_sent(1)
            await eventually(lambda: _card_tried(api), timeout=10, message="the card was not attempted")
            await wait_inbox_done(srv.runtime)
            rows = await settled_outbox(srv.runtime)
    assert "/approve" in prompt.body["text"]["content"]
    # The refused card does not fail the prompt's delivery (nor is it retried).
    assert [r.status for r in rows] == ["sent"]
    assert sum(1 for c in api.calls if c.body and c.body.get("msgtype") == "template_card") == 1


async def _card_tried(api: FakeWeComApi) -> bool:
    return any(c.body and c.body.get("msgtype") == "template_card" for c in api.calls)
