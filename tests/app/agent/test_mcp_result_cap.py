"""An MCP answer far over `MCP_RESULT_MAX_BYTES` is never held whole (issue 30): the call
is a tool error naming the cap, the connection and its session keep going, and this
process's peak resident memory barely moves. Real MCP servers (tests/fakes/mcp_server.py,
the SDK's own server) over stdio, streamable HTTP with SSE answers and with JSON answers."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import pytest

from app.agent.tools import ToolRegistry
from tests.app.agent.test_mcp import STDIO, call, http_server, source
from tests.support.servers import free_port

pytestmark = pytest.mark.serial  # measures this process's resident memory

CAP = 1024 * 1024
RESULT = 64 * 1024 * 1024  # scaled down from the 200 MB: 64 times the cap
# What one call may add to the peak: the cap held a few times over (bytes, text, parsed),
# and the rest of a call. Without the cap the 64 MiB answer alone is read whole.
GROWTH_MIB = 24


@contextmanager
def peak_growth() -> Iterator[list[float]]:
    """The rise of this process's peak resident set (VmHWM) over the block, in MiB."""
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS from now on
    before = _self_rss("VmRSS")
    out: list[float] = []
    yield out
    out.append(_self_rss("VmHWM") - before)


def _self_rss(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(field)


@pytest.mark.parametrize("transport", ["stdio", "http-sse", "http-json"])
async def test_an_answer_over_the_cap_is_a_tool_error_and_memory_stays_flat(transport: str) -> None:
    port = free_port()
    config: dict[str, Any] = (
        {**STDIO, "name": "big"}
        if transport == "stdio"
        else {"name": "big", "url": f"http://127.0.0.1:{port}/mcp"}
    )
    extra = ("json",) if transport == "http-json" else ()
    registry = ToolRegistry()
    mcp = source(registry, config, timeout=60, result_max_bytes=CAP)
    with http_server(port, *extra) if transport != "stdio" else nullcontext():
        await mcp.start()
        try:
            server = mcp.servers[0]
            pid = await call(registry, "big__whoami", {})
            # Under the cap (the SDK server sends the text twice: content and structured): whole.
            assert await call(registry, "big__big", {"size": CAP // 4}) == "x" * (CAP // 4)
            for _ in range(2):  # warm up whatever a first oversized call allocates once
                json.loads(await call(registry, "big__big", {"size": RESULT}))
            with peak_growth() as growth:
                result = json.loads(await call(registry, "big__big", {"size": RESULT}))
            assert f"result over {CAP} bytes" in result["error"], result
            assert "MCP_RESULT_MAX_BYTES" in result["error"]
            assert growth[0] < GROWTH_MIB, (
                f"peak RSS grew {growth[0]:.1f} MiB for a {RESULT >> 20} MiB answer"
            )
            # The session keeps going on the same connection (same server process).
            assert await call(registry, "big__add", {"a": 2, "b": 3}) == "5"
            assert await call(registry, "big__whoami", {}) == pid
            assert server.connects == 1 and server.state.value == "up"
        finally:
            await mcp.stop()
