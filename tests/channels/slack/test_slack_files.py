"""Files both ways on Slack: `send_file` answers with an external upload in the thread,
and a file shared with the bot is kept in the session's workspace (downloaded with the
bot token through `channels.common.media`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.fakes.slack import FakeSlack

REPORT = b"%PDF-1.4\n% a tiny report\n"
CSV = b"city,people\nBerlin,3850000\n"


async def test_send_file_answers_with_an_external_upload(serve: ServeApp, tmp_path: Path) -> None:
    (tmp_path / "report.pdf").write_bytes(REPORT)
    async with FakeOpenAI() as llm, FakeSlack() as fake:
        llm.enqueue(calls(ToolCall("send_file", {"path": "report.pdf"}, id="s1")), text("The report:"))
        async with (
            serve(
                channel_settings={"slack": slack_settings(fake, streaming="off")},
                **openai_settings(llm, workspace_root=str(tmp_path)),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await post_event(client, srv.url, sl.event_callback(sl.dm("the report please")))
            assert resp.status_code == 200
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "sent"
    assert [p["text"] for p in fake.posted()] == ["The report:"]
    [shared] = fake.completed
    assert (shared["channel"], shared["title"], shared["bytes"]) == ("D0ALICE", "report.pdf", REPORT)


def _shared(fake: FakeSlack, file_id: str, name: str, data: bytes) -> list[dict[str, Any]]:
    path = f"T0001-{file_id}/{name}"
    fake.files[path] = data
    return [{"id": file_id, "name": name, "mimetype": "text/csv", "size": len(data),
             "url_private": fake.files_url + path}]  # fmt: skip


async def test_a_shared_file_is_kept_in_the_sessions_workspace(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as llm, FakeSlack() as fake:
        llm.enqueue(
            calls(ToolCall("list_files", {"path": "inbox"}, id="l1")),
            text("Berlin has 3.85 million people."),
        )
        settings = slack_settings(fake, files_base_url=fake.files_url, streaming="off")
        async with (
            serve(
                channel_settings={"slack": settings},
                **openai_settings(llm, workspace_root=str(tmp_path), workspace_per_session=True),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = sl.dm("how many?", files=_shared(fake, "F0CSV", "cities.csv", CSV))
            resp = await post_event(client, srv.url, sl.event_callback(event, event_id="Ev0FILE"))
            assert resp.status_code == 200
            await wait_outbox_final(srv.runtime)
    [download] = fake.calls_of("download")
    assert download.headers["authorization"] == f"Bearer {fake.token}"
    [saved] = list(tmp_path.rglob("inbox/*"))  # noqa: ASYNC240 (a test's look at the disk)
    assert saved.read_bytes() == CSV
    assert saved.name.endswith("-cities.csv")
    listing = json.loads(
        next(m["content"] for m in llm.requests[1].messages if m.get("tool_call_id") == "l1")
    )
    assert [e["name"] for e in listing["entries"]] == [saved.name]
    user = [m for m in llm.requests[0].messages if m["role"] == "user"][-1]["content"]
    assert f"saved in your workspace as inbox/{saved.name}" in user
