"""Tool policy (allow/deny per service, channel, sender) and the workspace path policy."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.agent.policy import ToolPolicy
from app.agent.tools import ToolContext, ToolRegistry, builtin_tools
from app.agent.workspace import ListFilesTool, ReadFileTool, Workspace, WriteFileTool, file_tools
from app.db.models import runs
from channels.webhook import WebhookSettings
from tests.app.agent.test_agent_e2e import ask, openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text


async def _zero() -> int:
    return 0


def ctx() -> ToolContext:
    return ToolContext(
        session_id=1,
        session_key="k",
        channel="webhook",
        chat_id="c",
        sender_id="u",
        thread_id=None,
        message_count=_zero,
    )


# --- policy ---------------------------------------------------------------------------


def channel(**kw: Any) -> WebhookSettings:
    return webhook_settings(**kw)


def test_channel_lists_filter_and_globs_match() -> None:
    policy = ToolPolicy.build(
        channel=channel(tools_allow=["current_*", "session_info"], tools_deny=["*_info"])
    )
    assert policy.allows("current_time")
    assert not policy.allows("session_info")  # deny wins over allow
    assert not policy.allows("write_file")


def test_a_sender_entry_replaces_the_channel_lists_but_not_the_service_deny() -> None:
    settings = channel(
        tools_allow=["current_time"],
        tools_by_sender={"owner": {"allow": ["*"]}, "guest": {"deny": ["*"]}},
    )
    owner = ToolPolicy.build(deny=["write_file"], channel=settings, sender_id="owner")
    someone = ToolPolicy.build(deny=["write_file"], channel=settings, sender_id="someone")
    guest = ToolPolicy.build(channel=settings, sender_id="guest")
    assert owner.allows("session_info") and not owner.allows("write_file")
    assert someone.allows("current_time") and not someone.allows("session_info")
    assert not guest.allows("current_time")


def test_sender_policy_is_read_from_the_environment_as_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_TOOLS_DENY", "write_file, mcp_*")
    monkeypatch.setenv("WEBHOOK_TOOLS_BY_SENDER", json.dumps({"42": {"allow": ["read_file"]}}))
    settings = WebhookSettings(_env_file=None)  # type: ignore[call-arg]
    assert settings.tools_deny == ["write_file", "mcp_*"]
    assert settings.tools_by_sender == {"42": {"allow": ["read_file"]}}


def test_registry_offers_only_allowed_tools() -> None:
    registry = ToolRegistry(builtin_tools())
    policy = ToolPolicy.build(channel=channel(tools_deny=["current_time"]))
    assert [s.name for s in registry.specs(policy)] == ["session_info"]


async def test_a_denied_tool_is_not_offered_and_a_call_to_it_is_refused(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(ToolCall("current_time", {}, id="call_sneaky")), text("I may not."))
        settings = {"webhook": webhook_settings(tools_deny=["current_time"])}
        async with serve(channel_settings=settings, **openai_settings(fake)) as srv:
            body = await ask(srv, "what time is it?")
            async with srv.runtime.engine.connect() as conn:
                [run] = (await conn.execute(select(runs))).mappings().all()
        assert body["replies"][0]["text"] == "I may not."
        assert "current_time" not in fake.requests[0].tool_names
        result = fake.requests[1].messages[3]
        assert result["tool_call_id"] == "call_sneaky"
        assert "not allowed" in json.loads(result["content"])["error"]
    assert run["tool_calls"][0]["decision"] == "refused:policy"


async def test_per_sender_policy_end_to_end(serve: ServeApp) -> None:
    async with FakeOpenAI(default=text("ok")) as fake:
        settings = {
            "webhook": webhook_settings(
                tools_allow=["session_info"], tools_by_sender={"owner": {"allow": ["*"]}}
            )
        }
        async with serve(channel_settings=settings, **openai_settings(fake, tools_deny=["nothing"])) as srv:
            await ask(srv, "hi", chat="a", sender="guest")
            await ask(srv, "hi", chat="b", sender="owner")
        assert fake.requests[0].tool_names == ["session_info"]
        assert {"session_info", "current_time"} <= set(fake.requests[1].tool_names)


# --- workspace path policy ----------------------------------------------------------------


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "a.txt").write_text("hello")
    (tmp_path / "secret.txt").write_text("top secret")
    return root


@pytest.mark.parametrize(
    "path", ["../secret.txt", "docs/../../secret.txt", "/../secret.txt", "..", "docs/../.."]
)
async def test_dot_dot_cannot_escape(workspace: Path, path: str) -> None:
    tool = ReadFileTool(Workspace(workspace))
    result = json.loads(await ToolRegistry([tool]).execute(_call("read_file", path=path), ctx()))
    assert "outside the workspace" in result["error"]


async def test_absolute_paths_are_taken_inside_the_root(workspace: Path, tmp_path: Path) -> None:
    tool = ReadFileTool(Workspace(workspace))
    registry = ToolRegistry([tool])
    inside = json.loads(await registry.execute(_call("read_file", path="/docs/a.txt"), ctx()))
    assert inside["content"] == "hello"
    outside = json.loads(await registry.execute(_call("read_file", path=str(tmp_path / "secret.txt")), ctx()))
    assert "error" in outside and "top secret" not in json.dumps(outside)


async def test_symlinks_pointing_outside_are_refused(workspace: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "secret.txt", workspace / "leak.txt")
    os.symlink(tmp_path, workspace / "up")
    os.symlink(workspace / "docs" / "a.txt", workspace / "alias.txt")  # inside → fine
    registry = ToolRegistry(file_tools(workspace))
    for path in ("leak.txt", "up/secret.txt", "up/ws/docs/../../secret.txt"):
        result = json.loads(await registry.execute(_call("read_file", path=path), ctx()))
        assert "outside the workspace" in result["error"], path
    listed = json.loads(await registry.execute(_call("list_files", path="up"), ctx()))
    assert "outside the workspace" in listed["error"]
    written = json.loads(await registry.execute(_call("write_file", path="up/new.txt", content="x"), ctx()))
    assert "outside the workspace" in written["error"]
    assert not (tmp_path / "new.txt").exists()
    alias = json.loads(await registry.execute(_call("read_file", path="alias.txt"), ctx()))
    assert alias["content"] == "hello"


async def test_file_tools_read_list_write(workspace: Path) -> None:
    ws = Workspace(workspace)
    registry = ToolRegistry([ReadFileTool(ws), ListFilesTool(ws), WriteFileTool(ws)])
    written = json.loads(
        await registry.execute(_call("write_file", path="notes/today.md", content="# hi"), ctx())
    )
    assert written == {"path": "notes/today.md", "bytes": 4}
    assert (workspace / "notes" / "today.md").read_text() == "# hi"
    listed = json.loads(await registry.execute(_call("list_files"), ctx()))
    assert listed["entries"] == [{"name": "docs", "type": "dir"}, {"name": "notes", "type": "dir"}]
    read = json.loads(await registry.execute(_call("read_file", path="docs/a.txt", max_chars=2), ctx()))
    assert read == {"path": "docs/a.txt", "content": "he", "truncated": True}
    missing = json.loads(await registry.execute(_call("read_file", path="nope.txt"), ctx()))
    assert "no file" in missing["error"]


def test_risk_levels_are_declared() -> None:
    risks = {t.spec.name: t.risk.value for t in [*builtin_tools(), *file_tools("/tmp")]}
    assert (
        risks.items()
        >= {
            "current_time": "safe",
            "session_info": "safe",
            "read_file": "safe",
            "list_files": "safe",
            "write_file": "risky",
        }.items()
    )


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {
        "id": "call_1",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }
