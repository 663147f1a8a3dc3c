"""A real MCP server for the tests, built with the SDK's MCPServer (FastMCP in mcp 1.x).

    python -m tests.fakes.mcp_server stdio
    python -m tests.fakes.mcp_server http PORT [json]

Tools: `add` (read-only), `echo`, `write_note` (not read-only), `fail` (raises, so the
client gets an error result), `get.weather` (a name that is not provider-legal), `big` (a
result of any size), and `whoami` (the server's pid: tells a reconnect apart).
"""

from __future__ import annotations

import os
import sys

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("chatgate-test")
NOTES: list[str] = []


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def echo(text: str) -> str:
    """Echo the text back."""
    return f"echo: {text}"


@server.tool()
def write_note(text: str) -> str:
    """Store a note on the server (a write: risky unless the server is trusted)."""
    NOTES.append(text)
    return f"{len(NOTES)} notes"


@server.tool()
def fail(reason: str) -> str:
    """Always fails with the given reason."""
    raise RuntimeError(f"failed on purpose: {reason}")


@server.tool(name="get.weather", annotations=ToolAnnotations(read_only_hint=True))
def get_weather(city: str) -> str:
    """Weather of a city (always sunny)."""
    return f"sunny in {city}"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def big(size: int) -> str:
    """A result of `size` characters (a tool that answers far more than asked)."""
    return "x" * size


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def whoami() -> str:
    """The server process id."""
    return str(os.getpid())


def main(argv: list[str]) -> None:
    if argv[:1] == ["http"]:
        json_response = argv[2:3] == ["json"]  # one JSON body per answer instead of an SSE stream
        server.run("streamable-http", host="127.0.0.1", port=int(argv[1]), json_response=json_response)
    else:
        server.run("stdio")


if __name__ == "__main__":
    main(sys.argv[1:])
