"""Slack's platform-native events end to end (docs/events.md): a ✅ reaction on an approval
prompt approves it (the tool runs once), the prompt's buttons approve, a press by someone
not allowed gets an ephemeral refusal; a deleted message has our answer deleted. The real
app and slack_sdk client, a fake Slack Web API, the fake OpenAI server as the model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import approvals, runs
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.slack import FakeSlack
from tests.support.timing import eventually

DM = "D0ALICE"


def _serve(serve: ServeApp, fake: FakeSlack, model: FakeOpenAI, workspace: Path, **channel: Any) -> Any:
    settings = slack_settings(fake, streaming="off", approvers=["UBOSS"], **channel)
    return serve(
        channel_settings={"slack": settings}, **openai_settings(model, workspace_root=str(workspace))
    )


def _prompt_ts(fake: FakeSlack) -> str:
    [ts] = [ts for ts, t in fake.texts.items() if "/approve" in t]
    return ts


async def _table(srv: Any, table: Any) -> list[dict[str, Any]]:
    async with srv.runtime.engine.connect() as conn:
        return [dict(r) for r in (await conn.execute(select(table))).mappings()]


async def test_a_check_mark_reaction_on_an_approval_runs_the_tool_once(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeSlack() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "a.txt", "content": "x"})), text("Written."))
        async with _serve(serve, fake, model, tmp_path) as srv, httpx.AsyncClient(timeout=30) as client:
            await post_event(client, srv.url, sl.event_callback(sl.dm("write a.txt", user="UBOSS")))
            [prompt] = await fake.wait_for("chat.postMessage", 1)
            assert [e["action_id"] for e in prompt.params["blocks"][1]["elements"]] == ["approve", "deny"]
            ts = _prompt_ts(fake)
            reacted = sl.event_callback(sl.reaction("white_check_mark", on_ts=ts, channel=DM, user="UBOSS"))
            assert (await post_event(client, srv.url, reacted)).status_code == 200
            await post_event(client, srv.url, reacted)  # Slack's retry of the same event
            # A second ✅ (another event) finds the approval decided: the tool does not run again.
            again = sl.event_callback(sl.reaction("heavy_check_mark", on_ts=ts, channel=DM, user="UBOSS"))
            await post_event(client, srv.url, again)
            await eventually(lambda: "Written." in fake.texts.values())
            await wait_inbox_done(srv.runtime)
            [decided] = await _table(srv, approvals)
            [run] = await _table(srv, runs)
    assert (decided["status"], decided["decided_by"]) == ("approved", "UBOSS")
    assert (tmp_path / "a.txt").read_text() == "x"
    assert [c["decision"] for c in run["tool_calls"]] == ["approved"]  # ran once
    assert len(model.requests) == 2


async def test_a_button_press_approves_and_a_press_by_someone_else_is_refused_privately(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeSlack() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "b.txt", "content": "y"})), text("Done."))
        async with _serve(serve, fake, model, tmp_path) as srv, httpx.AsyncClient(timeout=30) as client:
            await post_event(client, srv.url, sl.event_callback(sl.dm("write b.txt", user="UBOSS")))
            [prompt] = await fake.wait_for("chat.postMessage", 1)
            value = prompt.params["blocks"][1]["elements"][0]["value"]
            ts = _prompt_ts(fake)

            async def press(user: str) -> None:
                body = sl.interaction_body(sl.block_action("approve", value, on_ts=ts, channel=DM, user=user))
                headers = {**sl.signed_headers(body), "Content-Type": "application/x-www-form-urlencoded"}
                resp = await client.post(
                    f"{srv.url}/channels/slack/interactions", content=body, headers=headers
                )
                assert resp.status_code == 200, resp.text

            await press("UMALLORY")
            [refusal] = await fake.wait_for("chat.postEphemeral", 1)
            await wait_inbox_done(srv.runtime)
            assert refusal.params["user"] == "UMALLORY" and "not allowed" in refusal.params["text"]
            assert not (tmp_path / "b.txt").exists()
            await press("UBOSS")
            await eventually(lambda: "Done." in fake.texts.values())
            [decided] = await _table(srv, approvals)
    assert (decided["status"], decided["decided_by"]) == ("approved", "UBOSS")
    assert (tmp_path / "b.txt").read_text() == "y"
    assert len(fake.calls_of("chat.postEphemeral")) == 1


async def test_a_deleted_message_has_our_answer_deleted(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as model, FakeSlack() as fake:
        async with _serve(serve, fake, model, tmp_path) as srv, httpx.AsyncClient(timeout=30) as client:
            message = sl.dm("my password is hunter2")
            await post_event(client, srv.url, sl.event_callback(message))
            await fake.wait_for("chat.postMessage", 1)
            await wait_inbox_done(srv.runtime)
            [answer_ts] = list(fake.texts)
            deleted = {
                "type": "message",
                "subtype": "message_deleted",
                "channel": DM,
                "channel_type": "im",
                "hidden": True,
                "deleted_ts": message["ts"],
                "ts": sl.new_ts(),
                "previous_message": {
                    "type": "message",
                    "user": message["user"],
                    "text": message["text"],
                    "ts": message["ts"],
                },
            }
            await post_event(client, srv.url, sl.event_callback(deleted))
            [deletion] = await fake.wait_for("chat.delete", 1)
    assert (deletion.params["channel"], deletion.params["ts"]) == (DM, answer_ts)
    assert answer_ts not in fake.texts


async def test_a_reaction_on_a_prompt_in_a_channel_thread_reaches_the_threads_session(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeSlack() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "c.txt", "content": "z"})), text("Filed."))
        async with _serve(serve, fake, model, tmp_path) as srv, httpx.AsyncClient(timeout=30) as client:
            asked = sl.mention("write c.txt", user="UBOSS", channel="C0GENERAL")
            await post_event(client, srv.url, sl.event_callback(asked))
            [prompt] = await fake.wait_for("chat.postMessage", 1)
            assert prompt.params["thread_ts"] == asked["ts"]  # the answer is in the message's thread
            reacted = sl.reaction(
                "white_check_mark", on_ts=_prompt_ts(fake), channel="C0GENERAL", user="UBOSS"
            )
            resp = await post_event(client, srv.url, sl.event_callback(reacted))
            assert resp.json()["session_key"] == f"slack:C0GENERAL:{asked['ts']}"
            await eventually(lambda: "Filed." in fake.texts.values())
    assert (tmp_path / "c.txt").read_text() == "z"
    assert fake.calls_of("conversations.replies")
