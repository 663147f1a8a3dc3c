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
answers. A broken connection (closed pipe, HTTP errors, timeouts) makes calls return
an error result the model can read, and the supervisor reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, ToolContext, ToolError, ToolRegistry
from app.config import Settings

log = structlog.get_logger(__name__)

_LEGAL = re.compile(r"[^a-zA-Z0-9_-]")


class McpServerConfig(BaseModel):
    """One entry of `MCP_SERVERS`: exactly one of `command` (stdio) and `url` (HTTP)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,32}$")
    command: list[str] | None = Field(None, min_length=1)
    url: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    trusted: bool = False
    tools: list[str] | None = None  # only these of the server's tools, when set
    enabled: bool = True

    @model_validator(mode="after")
    def _one_transport(self) -> McpServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("set exactly one of 'command' (stdio) and 'url' (streamable HTTP)")
        return self


def tool_name(server: str, tool: str, taken: Callable[[str], bool] = lambda _: False) -> str:
    """`<server>__<tool>` cut to the provider rule; a hash keeps distinct tools distinct."""
    raw = f"{server}__{tool}"
    name = _LEGAL.sub("_", raw)
    if name != raw or len(name) > 64 or taken(name):
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        if len(name) > 64 or taken(name):
            name = f"{name[:55]}_{digest}"
    return name


def result_text(result: Any) -> tuple[str, bool]:
    """A CallToolResult as text for the model, and whether it is an error."""
    parts: list[str] = []
    for block in result.content or ():
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data)} base64 characters]")
        elif kind == "resource":
            resource = block.resource
            parts.append(getattr(resource, "text", None) or f"[resource {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {block.uri}]")
    text = "\n".join(parts)
    if not text and result.structured_content is not None:
        text = json.dumps(result.structured_content, ensure_ascii=False)
    return text, bool(result.is_error)


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


class McpServerConnection:
    def __init__(
        self,
        config: McpServerConfig,
        *,
        call_timeout: float,
        connect_timeout: float,
        on_tools: Callable[[McpServerConnection, Sequence[Any]], None],
    ) -> None:
        self.config = config
        self.name = config.name
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.on_tools = on_tools
        self.client: Any = None
        self.attempted = asyncio.Event()  # first connection attempt finished (either way)
        self._broken = asyncio.Event()
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self.connects = 0

    def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        """What `mcp.Client` connects to; resources it does not own go on `stack`."""
        from mcp import StdioServerParameters
        from mcp.client.stdio import get_default_environment

        if self.config.url is not None:
            if not self.config.headers:
                return self.config.url
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            http = create_mcp_http_client(headers=self.config.headers)
            stack.push_async_callback(http.aclose)  # a client we pass in is not closed by the SDK
            return streamable_http_client(self.config.url, http_client=http)
        assert self.config.command is not None
        return StdioServerParameters(
            command=self.config.command[0],
            args=self.config.command[1:],
            env={**get_default_environment(), **self.config.env},
            cwd=self.config.cwd,
        )

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        self._stopping = True
        self._broken.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except (TimeoutError, asyncio.CancelledError, Exception):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task

    async def _supervise(self) -> None:
        from mcp import Client

        backoff = 0.5
        while not self._stopping:
            self._broken.clear()
            try:
                async with (
                    asyncio.timeout(self.connect_timeout) as deadline,  # handshake and listing
                    contextlib.AsyncExitStack() as stack,
                    Client(self._target(stack), read_timeout_seconds=self.call_timeout) as client,
                ):
                    tools = await self._list_tools(client)
                    deadline.reschedule(None)
                    self.client = client
                    self.connects += 1
                    backoff = 0.5
                    self.on_tools(self, tools)
                    log.info("mcp_connected", server=self.name, tools=len(tools))
                    self.attempted.set()
                    await self._broken.wait()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the transports raise ExceptionGroups
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                log.warning("mcp_connect_failed", server=self.name, error=_describe(exc))
            finally:
                self.client = None
                self.attempted.set()
            if self._stopping:
                break
            await self._sleep(backoff)
            backoff = min(backoff * 2, 30.0)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
            async with asyncio.timeout(seconds):
                await self._broken.wait()

    async def _list_tools(self, client: Any) -> list[Any]:
        tools: list[Any] = []
        cursor = None
        for _ in range(100):
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                break
        wanted = self.config.tools
        return [t for t in tools if wanted is None or t.name in wanted]

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError

        client = self.client
        if client is None:
            raise ToolError(f"MCP server {self.name!r} is not connected right now; try again later")
        try:
            async with asyncio.timeout(self.call_timeout):
                result = await client.call_tool(remote_name, arguments)
        except TimeoutError as exc:
            self._broken.set()
            raise ToolError(f"MCP server {self.name!r} did not answer within {self.call_timeout:g}s") from exc
        except MCPError as exc:
            if exc.code == -32000:  # connection closed
                self._broken.set()
            raise ToolError(f"MCP server {self.name!r}: {exc}") from exc
        except OSError as exc:
            self._broken.set()
            raise ToolError(f"MCP server {self.name!r} connection failed: {exc!r}") from exc
        text, is_error = result_text(result)
        if is_error:
            raise ToolError(text or f"tool {remote_name!r} on MCP server {self.name!r} failed")
        return text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"


class McpToolSource:
    """All configured MCP servers; registers their tools into `registry`."""

    def __init__(
        self,
        configs: Sequence[McpServerConfig],
        registry: ToolRegistry,
        *,
        call_timeout: float = 60.0,
        connect_timeout: float = 15.0,
    ) -> None:
        self.registry = registry
        self.connect_timeout = connect_timeout
        self.servers = [
            McpServerConnection(
                c, call_timeout=call_timeout, connect_timeout=connect_timeout, on_tools=self._register
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

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers), return_exceptions=True)
