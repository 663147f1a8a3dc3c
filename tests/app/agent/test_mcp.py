"""MCP tool sources against real MCP servers (tests/fakes/mcp_server.py) over stdio and
streamable HTTP, started by the tests as subprocesses."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from structlog.testing import capture_logs

from app.agent.mcp import McpToolSource, tool_name
from app.agent.mcp_connection import McpServerConfig, ServerState
from app.agent.provider import ProviderReply, ToolSpec
from app.agent.tools import Risk, ToolContext, ToolRegistry
from app.sessions.messages import ChatMessage, tool_call
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.memory.support import say
from tests.support.servers import ROOT, free_port, kept_port
from tests.support.timing import eventually, scaled

STDIO = {"name": "fx", "command": [sys.executable, "-m", "tests.fakes.mcp_server", "stdio"], "cwd": str(ROOT)}


@contextmanager
def http_server(port: int, *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.mcp_server", "http", str(port), *extra],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + scaled(20)
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("MCP test server did not start") from None
                time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


async def _zero() -> int:
    return 0


def ctx() -> ToolContext:
    return ToolContext(
        session_id=1,
        session_key="webhook:t",
        channel="webhook",
        chat_id="t",
        sender_id="u",
        thread_id=None,
        message_count=_zero,
    )


async def call(registry: ToolRegistry, name: str, args: dict[str, Any]) -> str:
    return await registry.execute(tool_call("call_1", name, args), ctx())


def source(registry: ToolRegistry, *configs: dict[str, Any], timeout: float = 10, **kw: Any) -> McpToolSource:
    return McpToolSource(
        [McpServerConfig.model_validate(c) for c in configs],
        registry,
        call_timeout=timeout,
        connect_timeout=timeout,
        **kw,
    )


async def check_fake_tools(registry: ToolRegistry, prefix: str) -> None:
    names = {s.name for s in registry.specs()}
    expected = {f"{prefix}__{t}" for t in ("add", "echo", "write_note", "fail", "get_weather", "whoami")}
    assert expected <= names
    add = registry.get(f"{prefix}__add")
    assert add is not None
    assert add.spec.parameters["properties"]["a"]["type"] == "integer"
    assert add.spec.parameters["required"] == ["a", "b"]
    assert await call(registry, f"{prefix}__add", {"a": 2, "b": 3}) == "5"
    assert await call(registry, f"{prefix}__get_weather", {"city": "Oslo"}) == "sunny in Oslo"
    failed = json.loads(await call(registry, f"{prefix}__fail", {"reason": "boom"}))
    assert "error" in failed and "fail" in failed["error"]
    bad_args = json.loads(await call(registry, f"{prefix}__add", {"a": "x"}))
    assert "error" in bad_args


async def test_stdio_server_tools_are_listed_with_prefix_and_called() -> None:
    registry = ToolRegistry()
    mcp = source(registry, STDIO)
    await mcp.start()
    try:
        await check_fake_tools(registry, "fx")
        # Risk: read-only tools are safe; anything else waits for approval.
        assert registry.get("fx__add").risk is Risk.SAFE  # type: ignore[union-attr]
        assert registry.get("fx__get_weather").risk is Risk.SAFE  # type: ignore[union-attr]
        assert registry.get("fx__write_note").risk is Risk.RISKY  # type: ignore[union-attr]
        assert registry.get("fx__echo").risk is Risk.RISKY  # type: ignore[union-attr]
    finally:
        await mcp.stop()
    assert mcp.servers[0].client is None


async def test_trusted_server_and_tool_allow_list() -> None:
    registry = ToolRegistry()
    mcp = source(registry, {**STDIO, "name": "tr", "trusted": True, "tools": ["echo", "write_note"]})
    await mcp.start()
    try:
        assert {s.name for s in registry.specs()} == {"tr__echo", "tr__write_note"}
        assert registry.get("tr__write_note").risk is Risk.SAFE  # type: ignore[union-attr]
        assert await call(registry, "tr__echo", {"text": "hi"}) == "echo: hi"
    finally:
        await mcp.stop()


async def test_streamable_http_server_and_reconnect_after_it_died() -> None:
    port = kept_port()  # the server comes back on it
    registry = ToolRegistry()
    config = {"name": "web", "url": f"http://127.0.0.1:{port}/mcp", "headers": {"X-Chatgate-Test": "1"}}
    mcp = source(registry, config, timeout=5)
    with http_server(port):
        await mcp.start()
        try:
            await check_fake_tools(registry, "web")
            first_pid = await call(registry, "web__whoami", {})
        except BaseException:
            await mcp.stop()
            raise
    # The server is gone: a call is an error result the model can read, not an exception.
    down = json.loads(await call(registry, "web__add", {"a": 1, "b": 1}))
    assert "error" in down and "web" in down["error"]
    with http_server(port):
        deadline = time.monotonic() + scaled(30)
        while True:
            result = await call(registry, "web__whoami", {})
            if result.isdigit():
                break
            assert time.monotonic() < deadline, result
            await asyncio.sleep(0.2)
        assert result != first_pid  # a new connection to the new process
        assert await call(registry, "web__add", {"a": 20, "b": 22}) == "42"
        await mcp.stop()


async def test_dead_servers_at_start_are_survived() -> None:
    registry = ToolRegistry()
    mcp = source(
        registry,
        {"name": "nocmd", "command": ["/nonexistent/mcp-server"]},
        {"name": "noport", "url": f"http://127.0.0.1:{free_port()}/mcp"},
        {**STDIO, "name": "ok"},
        timeout=10,
    )
    started = time.monotonic()
    await mcp.start()
    try:
        assert time.monotonic() - started < 10
        names = {s.name for s in registry.specs()}
        assert "ok__add" in names
        assert not any(n.startswith(("nocmd__", "noport__")) for n in names)
        assert await call(registry, "ok__add", {"a": 1, "b": 2}) == "3"
    finally:
        await mcp.stop()


async def test_a_server_that_never_answers_does_not_hold_up_start_or_stop() -> None:
    registry = ToolRegistry()
    hung = {"name": "hung", "command": [sys.executable, "-c", "import time; time.sleep(60)"]}
    mcp = source(registry, hung, timeout=1.5)
    started = time.monotonic()
    await mcp.start()
    assert time.monotonic() - started < 5
    assert registry.specs() == []
    started = time.monotonic()
    await mcp.stop()
    assert time.monotonic() - started < 8


def test_names_are_provider_legal_and_distinct() -> None:
    taken: set[str] = set()
    for server, tool in [("s", "get.weather"), ("s", "get_weather"), ("s", "x" * 80), ("s", "x" * 81)]:
        name = tool_name(server, tool, taken=lambda n: n in taken)
        assert len(name) <= 64 and all(c.isalnum() or c in "_-" for c in name)
        assert name not in taken
        taken.add(name)


def test_config_needs_exactly_one_transport() -> None:
    with pytest.raises(ValueError):
        McpServerConfig.model_validate({"name": "x"})
    with pytest.raises(ValueError):
        McpServerConfig.model_validate({"name": "x", "command": ["a"], "url": "http://x"})
    with pytest.raises(ValueError):
        McpServerConfig.model_validate({"name": "bad name", "url": "http://x"})


class McpCallingProvider:
    """Asks for one MCP tool call per user message "call <tool> <json args>", then answers."""

    name = "mcp-script"

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        **_: Any,
    ) -> ProviderReply:
        last = messages[-1]
        if last.role == "tool":
            return ProviderReply(content=f"result: {last.content}")
        text = last.content or ""
        if text.startswith("call "):
            _verb, name, args = text.split(" ", 2)
            assert name in {t.name for t in tools}
            return ProviderReply(content=None, tool_calls=(tool_call("c1", name, json.loads(args)),))
        return ProviderReply(content="ok")

    async def aclose(self) -> None:
        return None


async def test_agent_calls_mcp_tools_through_the_registry_and_its_gate(serve: ServeApp) -> None:
    servers = [STDIO, {"name": "gone", "url": f"http://127.0.0.1:{free_port()}/mcp"}]
    async with (
        serve(provider=McpCallingProvider(), mcp_servers=servers, mcp_connect_timeout_seconds=10) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        assert (await client.get(f"{srv.url}/healthz")).status_code == 200  # the dead server is survived
        body = await say(client, srv.url, "m", "u", 'call fx__add {"a": 40, "b": 2}')
        assert body["replies"][0]["text"] == "result: 42"
        # Operators see each server's state in the admin API and in /metrics.
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        assert (await client.get(f"{srv.url}/admin/api/mcp")).status_code == 401
        states = {
            s["name"]: s
            for s in (await client.get(f"{srv.url}/admin/api/mcp", headers=admin)).json()["servers"]
        }
        assert (
            states["fx"]["state"] == "up"
            and states["fx"]["transport"] == "stdio"
            and states["fx"]["tools"] > 0
        )
        assert states["gone"]["state"] != "up" and states["gone"]["transport"] == "http"
        metrics = (await client.get(f"{srv.url}/metrics")).text
        assert 'chatgate_mcp_server_up{server="fx"} 1.0' in metrics
        assert 'chatgate_mcp_server_up{server="gone"} 0.0' in metrics
        hist = await client.get(
            f"{srv.url}/admin/api/sessions/webhook%3Am/messages",
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )
        tool_msgs = [m for m in hist.json()["messages"] if m["role"] == "tool"]
        assert tool_msgs[-1]["content"] == "42"
        # A risky MCP tool goes through the approval gate: a webhook session has no
        # approver, so it is denied and the server never sees the call.
        body = await say(client, srv.url, "m", "u", 'call fx__write_note {"text": "x"}')
        assert "denied" in body["replies"][0]["text"]
        assert "notes" not in body["replies"][0]["text"]


def gated_stdio(name: str, flag: Path, module: str = "tests.fakes.mcp_server") -> dict[str, Any]:
    """The real test server over stdio, startable only while `flag` exists: a server that
    cannot be (re)started for a while, like a crashed service whose binary is being replaced."""
    script = 'test -e "$1" || exit 3; exec "$2" -m "$3" stdio'
    return {
        "name": name,
        "command": ["/bin/sh", "-c", script, "sh", str(flag), sys.executable, module],
        "cwd": str(ROOT),
    }


async def pid_after_reconnect(registry: ToolRegistry, name: str, within: float = 30) -> int:
    deadline = time.monotonic() + scaled(within)
    while True:
        result = await call(registry, name, {})
        if result.isdigit():
            return int(result)
        assert time.monotonic() < deadline, result
        await asyncio.sleep(0.1)


async def test_a_killed_stdio_server_is_noticed_at_once_reported_down_and_reconnected(tmp_path: Path) -> None:
    flag = tmp_path / "may-start"
    flag.touch()
    registry = ToolRegistry()
    mcp = source(registry, gated_stdio("gated", flag))  # default probe interval: the end of stdout is enough
    await mcp.start()
    try:
        server = mcp.servers[0]
        pid = int(await call(registry, "gated__whoami", {}))
        assert server.state is ServerState.UP
        flag.unlink()  # it cannot be started again for now
        with capture_logs() as logs:
            os.kill(pid, signal.SIGKILL)
            # Noticed without any tool call: the watcher sees the process's stdout close.
            await eventually(lambda: server.state is ServerState.DOWN, timeout=3)
        [down_log] = [e for e in logs if e["event"] == "mcp_server_down"]
        assert down_log["server"] == "gated" and "exited" in down_log["reason"]
        assert mcp.status()[0]["state"] == "down"

        # A call now answers at once with an error result the model can read, and the
        # tools stay registered (a run that already offered them keeps a legal structure).
        started = time.monotonic()
        down = json.loads(await call(registry, "gated__add", {"a": 1, "b": 2}))
        assert time.monotonic() - started < 2  # not the 30 s call timeout, nor a reconnect
        assert "'gated' is down" in down["error"] and "exited" in down["error"]
        assert "reconnecting" in down["error"]
        assert {"gated__add", "gated__whoami"} <= {s.name for s in registry.specs()}

        await asyncio.sleep(1.5)  # restarts fail meanwhile (backoff): still down, still fast errors
        assert server.state is ServerState.DOWN
        assert "error" in json.loads(await call(registry, "gated__add", {"a": 1, "b": 2}))

        flag.touch()  # the server can be started again: the supervisor brings the tools back
        new_pid = await pid_after_reconnect(registry, "gated__whoami")
        assert new_pid != pid
        assert server.state is ServerState.UP and server.connects == 2
        assert await call(registry, "gated__add", {"a": 20, "b": 22}) == "42"
    finally:
        await mcp.stop()
    assert mcp.status()[0]["state"] == "stopped"


SLOW_SERVER = """
import os

import anyio
from mcp.server.mcpserver import MCPServer

server = MCPServer("slow")


@server.tool()
def pid() -> str:
    return str(os.getpid())


@server.tool()
async def wait(seconds: float) -> str:
    await anyio.sleep(seconds)
    return "waited"


server.run("stdio")
"""


async def test_a_call_in_flight_when_the_server_dies_fails_at_once(tmp_path: Path) -> None:
    (tmp_path / "slow_mcp_server.py").write_text(SLOW_SERVER)
    config = {"name": "slow", "command": [sys.executable, "slow_mcp_server.py"], "cwd": str(tmp_path)}
    registry = ToolRegistry()
    mcp = source(registry, config, timeout=30)
    await mcp.start()
    try:
        pid = int(await call(registry, "slow__pid", {}))
        pending = asyncio.create_task(call(registry, "slow__wait", {"seconds": 25}))
        await asyncio.sleep(0.5)
        assert not pending.done()
        started = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        result = json.loads(await asyncio.wait_for(pending, 5))
        assert time.monotonic() - started < 3  # not the 30 s call timeout
        assert "'slow'" in result["error"] and "down" in result["error"]
        assert await pid_after_reconnect(registry, "slow__pid") != pid  # restarted by the supervisor
    finally:
        await mcp.stop()


async def test_a_hung_server_is_found_by_the_liveness_probe_and_replaced() -> None:
    registry = ToolRegistry()
    mcp = source(registry, {**STDIO, "name": "hang"}, probe_interval=0.3, probe_timeout=0.5)
    await mcp.start()
    pid = int(await call(registry, "hang__whoami", {}))
    try:
        server = mcp.servers[0]
        os.kill(pid, signal.SIGSTOP)  # alive, pipes open, but answering nothing
        await eventually(lambda: server.state is ServerState.DOWN, timeout=5)
        assert "liveness probe" in (server.down_reason or "")
        fast = json.loads(await call(registry, "hang__add", {"a": 1, "b": 1}))
        assert "'hang' is down" in fast["error"]
        # The hung process is killed on teardown and a fresh one takes its place.
        assert await pid_after_reconnect(registry, "hang__whoami") != pid
        assert server.state is ServerState.UP
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        await mcp.stop()


async def test_a_vanished_http_server_is_reported_down_without_a_call() -> None:
    port = kept_port()  # the server comes back on it
    registry = ToolRegistry()
    config = {"name": "gone", "url": f"http://127.0.0.1:{port}/mcp"}
    mcp = source(registry, config, timeout=5, probe_interval=0.3, probe_timeout=2)
    try:
        with http_server(port):
            await mcp.start()
            assert await call(registry, "gone__add", {"a": 1, "b": 1}) == "2"
        server = mcp.servers[0]
        await eventually(lambda: server.state is ServerState.DOWN, timeout=5)
        down = json.loads(await call(registry, "gone__add", {"a": 1, "b": 1}))
        assert "'gone' is down" in down["error"]
        with http_server(port):
            await pid_after_reconnect(registry, "gone__whoami")
            assert server.state is ServerState.UP
    finally:
        await mcp.stop()
