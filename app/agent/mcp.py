"""MCP servers as tool sources (stdio and streamable HTTP, through the `mcp` SDK).

Each configured server gets one long-lived connection, owned by its own supervisor
task (the SDK's transports are anyio task groups, which must be entered and left by
the same task). Its tools are registered in the `ToolRegistry` as `<server>__<tool>`
(provider-legal: `^[a-zA-Z0-9_-]{1,64}$`) with the server's JSON schemas, so model calls
go through the registry's execute path like any built-in, with its policy and approval
gate. A tool is `risky` unless its server is configured `trusted` or the tool is
annotated read-only.

A server that is down at start-up does not stop the app: it is logged, its tools are
absent, and the supervisor keeps reconnecting with backoff; tools appear once it
answers.

Liveness: the supervisor watches a live connection itself instead of waiting for the
next tool call to trip over a dead one. The transport's read stream is wrapped so its
end (a stdio server's stdout closing: the process exited or was killed) marks the
server down at once, and a cheap `tools/list` probe every `probe_interval` seconds
catches what leaves no end of stream (a hung process, an HTTP server that went away).
A failed call (closed connection, timeout) marks it down too. Down means: logged
once (`mcp_server_down`), calls answer an error result immediately (in-flight calls get
one when the connection is torn down), registered tools stay registered so a run's
tool-call structure never breaks, and the supervisor reconnects with jittered
exponential backoff that only resets after a connection stayed up for a while (a
crash-looping server is not restarted twice a second forever).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from pydantic import ValidationError

from app.agent.mcp_connection import McpServerConfig, McpServerConnection
from app.agent.provider import ToolSpec
from app.agent.tools import Risk, ToolContext, ToolRegistry
from app.config import Settings

log = structlog.get_logger(__name__)

_LEGAL = re.compile(r"[^a-zA-Z0-9_-]")


def tool_name(server: str, tool: str, taken: Callable[[str], bool] = lambda _: False) -> str:
    """`<server>__<tool>` cut to the provider rule; a hash keeps distinct tools distinct."""
    raw = f"{server}__{tool}"
    name = _LEGAL.sub("_", raw)
    if name != raw or len(name) > 64 or taken(name):
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        if len(name) > 64 or taken(name):
            name = f"{name[:55]}_{digest}"
    return name


class McpTool:
    def __init__(self, server: McpServerConnection, remote: Any, name: str, risk: Risk) -> None:
        self.server = server
        self.remote_name: str = remote.name
        schema = dict(remote.input_schema or {})
        schema.setdefault("type", "object")
        schema.setdefault("properties", {})
        description = remote.description or getattr(remote, "title", None) or remote.name
        self.spec = ToolSpec(
            name=name, description=f"[{server.name}] {description}"[:1024], parameters=schema
        )
        self.risk = risk

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        return await self.server.call(self.remote_name, arguments)


class McpToolSource:
    """All configured MCP servers; registers their tools into `registry`."""

    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        registry: ToolRegistry,
        *,
        call_timeout: float = 60.0,
        connect_timeout: float = 15.0,
        probe_interval: float = 15.0,
        probe_timeout: float = 10.0,
        result_max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.registry = registry
        self.connect_timeout = connect_timeout
        self.servers = [
            McpServerConnection(
                c,
                call_timeout=call_timeout,
                connect_timeout=connect_timeout,
                probe_interval=probe_interval,
                probe_timeout=probe_timeout,
                result_max_bytes=result_max_bytes,
                on_tools=self._register,
            )
            for c in configs
            if c.enabled
        ]
        self._names: dict[tuple[str, str], str] = {}

    @classmethod
    def from_settings(cls, settings: Settings, registry: ToolRegistry) -> McpToolSource:
        configs: list[McpServerConfig] = []
        for raw in settings.mcp_servers:
            try:
                configs.append(McpServerConfig.model_validate(raw))
            except ValidationError as exc:
                log.error("mcp_server_config_invalid", entry=raw, error=str(exc))
        return cls(
            configs,
            registry,
            call_timeout=settings.mcp_call_timeout_seconds,
            connect_timeout=settings.mcp_connect_timeout_seconds,
            result_max_bytes=settings.mcp_result_max_bytes,
        )

    def _register(self, server: McpServerConnection, tools: Sequence[Any]) -> None:
        for remote in tools:
            if (server.name, remote.name) in self._names:
                continue  # registered on an earlier connection; calls reach the live one
            name = tool_name(server.name, remote.name, taken=lambda n: n in self.registry)
            annotations = getattr(remote, "annotations", None)
            read_only = bool(annotations is not None and annotations.read_only_hint)
            risk = Risk.SAFE if server.config.trusted or read_only else Risk.RISKY
            self.registry.register(McpTool(server, remote, name, risk))
            self._names[(server.name, remote.name)] = name

    async def start(self) -> None:
        """Connect every server, waiting at most the connect timeout; never raises."""
        for server in self.servers:
            server.start()
        if self.servers:
            waits = [asyncio.create_task(s.attempted.wait()) for s in self.servers]
            _, pending = await asyncio.wait(waits, timeout=self.connect_timeout)
            for task in pending:
                task.cancel()
            for server in self.servers:
                if server.client is None:
                    log.error("mcp_server_unavailable", server=server.name)

    def status(self) -> list[dict[str, Any]]:
        """Each server's state (`connecting`, `up`, `down`, `stopped`), since when, and why."""
        return [s.status() for s in self.servers]

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)
