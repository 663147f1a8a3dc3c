"""Discord approval buttons end to end (docs/events.md): an approval prompt carries approve /
deny buttons (components); a press (a signed MESSAGE_COMPONENT interaction) is acknowledged
at once (type 6); by a member who may not approve it is refused with an ephemeral follow-up
(flags 64) and runs nothing; by an approver it approves and the tool runs once. The real app
and discord.py against a fake Gateway and REST API, the fake OpenAI server."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from app.db.models import approvals
from tests.channels.discord.support import (
    component_press,
    post_interaction,
    served_with_tools,
)
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.support.timing import eventually


async def test_an_approval_button_approves_and_a_press_by_someone_else_is_refused_ephemerally(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeDiscord() as fake:
        model.enqueue(calls(ToolCall("write_file", {"path": "out.txt", "content": "hi"})), text("Written."))
        async with served_with_tools(serve, fake, model, tmp_path, streaming="off", approvers=["3000"]) as (
            srv,
            client,
        ):
            await fake.dispatch("MESSAGE_CREATE", dc.message("write out.txt"))
            [prompt] = await fake.wait_for_messages(1)
            assert "/approve" in prompt.body["content"]  # the typed command is still named
            [row] = prompt.body["components"]
            approve, deny = (b["custom_id"] for b in row["components"])
            assert approve.startswith("approve:") and deny.startswith("deny:")
            prompt_id = next(i for i, t in fake.texts.items() if "/approve" in t)

            # A member who may not approve: acknowledged, an ephemeral follow-up, nothing run.
            press = component_press(approve, message_id=prompt_id, interaction_id="7001", user_id="3666")
            resp = await post_interaction(client, srv.url, press)
            assert (resp.status_code, resp.json()) == (200, {"type": 6})
            await fake.wait_until(lambda: any(c.path.endswith("/itoken-7001") for c in fake.calls))
            await wait_inbox_done(srv.runtime)
            [refused] = [c for c in fake.calls if c.path.endswith("/itoken-7001")]
            assert refused.method == "POST" and refused.path == f"/webhooks/{dc.APP_ID}/itoken-7001"
            assert refused.body["flags"] == 64 and "not allowed" in refused.body["content"]
            assert not (tmp_path / "out.txt").exists()
            assert [c.path for c in fake.messages()] == [prompt.path, refused.path]  # nothing in the chat

            press = component_press(approve, message_id=prompt_id, interaction_id="7002", user_id="3000")
            resp = await post_interaction(client, srv.url, press)
            assert resp.json() == {"type": 6}
            await eventually(lambda: "Written." in fake.texts.values())
            await wait_inbox_done(srv.runtime)
            # The same interaction redelivered is one event: nothing runs again.
            await post_interaction(client, srv.url, press)
            await wait_inbox_done(srv.runtime)
            async with srv.runtime.engine.connect() as conn:
                [decided] = (await conn.execute(select(approvals))).mappings().all()
    assert (decided["status"], decided["decided_by"]) == ("approved", "3000")
    assert (tmp_path / "out.txt").read_text() == "hi"
    assert list(fake.texts.values()).count("Written.") == 1
    assert not any(c.path.endswith("/itoken-7002") for c in fake.calls)  # no notice for the approver
    tool_results = [m for r in model.requests for m in r.messages if m["role"] == "tool"]
    assert len(tool_results) == 1


async def test_an_approval_prompt_that_ends_a_streamed_preview_gets_its_buttons(
    serve: ServeApp, tmp_path: Path
) -> None:
    async with FakeOpenAI() as model, FakeDiscord() as fake:
        said = "Sure, I will write that file for you right now, give me a moment please."
        model.enqueue(
            calls(ToolCall("write_file", {"path": "s.txt", "content": "s"}), content=said, chunk_delay=0.15),
            text("Written."),
        )
        async with served_with_tools(
            serve, fake, model, tmp_path, streaming="edit", stream_edit_seconds=0.1, approvers=["3000"]
        ) as _served:
            await fake.dispatch("MESSAGE_CREATE", dc.message("write s.txt"))
            await fake.wait_until(lambda: any("components" in c.body for c in fake.calls))
    # The preview became the prompt (its last edit), and that edit carried the buttons.
    [posted] = [c for c in fake.messages() if c.method == "POST"]
    [last] = [c for c in fake.calls if "components" in c.body]
    assert last.method == "PATCH" and "/approve" in last.body["content"]
    assert last.path.startswith(posted.path)
