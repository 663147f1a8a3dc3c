"""Per-session workspaces: a session's file tools see only its own directory
(WORKSPACE_ROOT/<agent>/<escaped key>/<generation>), and the lifecycle sweep removes or
archives the directory of a closed session. The model is a fake OpenAI server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents.test_agents import post
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.support.timing import eventually


def tool_results(request: Any) -> list[str]:
    return [m["content"] for m in request.messages if m["role"] == "tool"]


async def test_sessions_cannot_read_each_others_files(serve: ServeApp, tmp_path: Path) -> None:
    root = tmp_path / "ws"
    c1_dir = root / "default" / "webhook%3Ac1" / "1"  # the documented layout, spelled out
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(ToolCall("list_files", {}, id="l1")),
            text("listed"),
            calls(ToolCall("read_file", {"path": "secret.txt"}, id="r1")),
            text("c1 read it"),
            calls(
                ToolCall("read_file", {"path": "secret.txt"}, id="r2"),
                ToolCall("read_file", {"path": "../../webhook%3Ac1/1/secret.txt"}, id="r3"),
                ToolCall("read_file", {"path": str(c1_dir / "secret.txt")}, id="r4"),
            ),
            text("c2 could not"),
        )
        settings = openai_settings(fake, workspace_root=str(root), workspace_per_session=True)
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "what is here?", chat="c1") == "listed"
            assert json.loads(tool_results(fake.requests[1])[0])["entries"] == []
            (c1_dir / "secret.txt").write_text("PIN 1234")
            assert await post(client, srv, "read my secret", chat="c1") == "c1 read it"
            assert await post(client, srv, "read their secret", chat="c2") == "c2 could not"
        assert "PIN 1234" in tool_results(fake.requests[3])[-1]
        others = tool_results(fake.requests[5])
        assert len(others) == 3 and not any("PIN 1234" in r for r in others)
        assert (root / "default" / "webhook%3Ac2" / "1").is_dir()


@pytest.mark.parametrize("mode", ["remove", "archive"])
async def test_a_closed_sessions_workspace_is_cleaned_by_the_sweep(
    serve: ServeApp, tmp_path: Path, mode: str
) -> None:
    root = tmp_path / "ws"
    async with FakeOpenAI() as fake:
        fake.default = lambda body: (
            text("done") if body["messages"][-1]["role"] == "tool" else calls(ToolCall("list_files", {}))
        )
        settings = openai_settings(
            fake,
            workspace_root=str(root),
            workspace_per_session=True,
            workspace_cleanup=mode,
            lifecycle_sweep_seconds=0.1,
        )
        async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as client:
            await post(client, srv, "hi", chat="c1")
            await post(client, srv, "hi", chat="c2")
            c1, c2 = root / "default" / "webhook%3Ac1" / "1", root / "default" / "webhook%3Ac2" / "1"
            assert c1.is_dir() and c2.is_dir()
            (c1 / "notes.txt").write_text("old")
            await post(client, srv, "/new", chat="c1")
            await eventually(lambda: not c1.exists())
            await post(client, srv, "hi again", chat="c1")
            assert (root / "default" / "webhook%3Ac1" / "2").is_dir()
            assert c2.is_dir()  # an open session's workspace stays
        archived = root / ".archive" / "default" / "webhook%3Ac1" / "1" / "notes.txt"
        assert archived.exists() == (mode == "archive")
