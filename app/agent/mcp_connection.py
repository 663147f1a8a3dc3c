"""One MCP server's long-lived connection: its supervisor, liveness and calls (`app.agent.mcp`)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from enum import StrEnum
from types import TracebackType
from typing import Any

import anyio
import structlog
from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.agent.mcp_bounded import bounded_stdio_client, capped_http_client, oversized_limit
from app.agent.tools import ToolError

log = structlog.get_logger(__name__)

_CONNECTION_CLOSED = -32000  # the SDK's JSON-RPC code for a transport that closed

BACKOFF_FIRST_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
# A connection that lived this long was healthy: the next outage starts the backoff over.
STABLE_AFTER_SECONDS = 30.0


class ServerState(StrEnum):
    CONNECTING = "connecting"  # first attempt not finished yet
    UP = "up"
    DOWN = "down"  # not connected; the supervisor is reconnecting
    STOPPED = "stopped"


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


class _WatchedReadStream:
    """The transport's read stream, reporting its end: for stdio that is the server's
    stdout closing, which happens the moment the process exits or is killed."""

    def __init__(self, inner: Any, on_end: Callable[[], None]) -> None:
        self._inner = inner
        self._on_end = on_end

    @property
    def last_context(self) -> Any:  # read by the SDK's dispatcher when the inner has it
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_end()
            raise

    def __aiter__(self) -> _WatchedReadStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _WatchedReadStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


@contextlib.asynccontextmanager
async def _watched(transport: Any, on_end: Callable[[], None]) -> AsyncIterator[tuple[Any, Any]]:
    async with transport as (read_stream, write_stream):
        yield _WatchedReadStream(read_stream, on_end), write_stream


class McpServerConnection:
    def __init__(
        self,
        config: McpServerConfig,
        *,
        call_timeout: float,
        connect_timeout: float,
        on_tools: Callable[[McpServerConnection, Sequence[Any]], None],
        probe_interval: float = 15.0,
        probe_timeout: float = 10.0,
        result_max_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.config = config
        self.result_max_bytes = result_max_bytes
        self.name = config.name
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self.probe_interval = probe_interval
        self.probe_timeout = probe_timeout
        self.on_tools = on_tools
        self.client: Any = None
        self.attempted = asyncio.Event()  # first connection attempt finished (either way)
        self.state = ServerState.CONNECTING
        self.down_reason: str | None = None
        self.state_since = time.time()
        self.connects = 0
        self.tool_count = 0
        self._broken = asyncio.Event()  # the current connection is dead: leave it
        self._stop = asyncio.Event()
        self._generation = 0  # which connection a late end-of-stream belongs to
        self._task: asyncio.Task[None] | None = None

    def _target(self, stack: contextlib.AsyncExitStack) -> Any:
        """The transport `mcp.Client` connects through; resources it does not own go on `stack`."""
        from mcp.client.stdio import get_default_environment
        from mcp.client.streamable_http import streamable_http_client

        limit = self.result_max_bytes
        if self.config.url is not None:
            http = capped_http_client(self.config.headers, limit)
            stack.push_async_callback(http.aclose)  # a client we pass in is not closed by the SDK
            return streamable_http_client(self.config.url, http_client=http, max_sse_event_size=limit)
        assert self.config.command is not None
        return bounded_stdio_client(
            self.config.command,
            env={**get_default_environment(), **self.config.env},
            cwd=self.config.cwd,
            limit=limit,
        )

    def status(self) -> dict[str, Any]:
        """What an operator needs to know about this server right now."""
        return {
            "name": self.name,
            "transport": "stdio" if self.config.command is not None else "http",
            "state": self.state.value,
            "since": self.state_since,
            "reason": self.down_reason,
            "connects": self.connects,
            "tools": self.tool_count,
        }

    def start(self) -> None:
        self._task = asyncio.create_task(self._supervise(), name=f"mcp:{self.name}")

    async def stop(self) -> None:
        self._stop.set()
        self._broken.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), 5)
            except (TimeoutError, asyncio.CancelledError, Exception):
                self._task.cancel()
                with contextlib.suppress(BaseException):
                    await self._task
        self._set_state(ServerState.STOPPED, None)

    def _set_state(self, state: ServerState, reason: str | None) -> None:
        if state is not self.state:
            self.state_since = time.time()
        self.state = state
        self.down_reason = reason

    def mark_down(self, reason: str, *, generation: int | None = None) -> None:
        """The connection is dead: calls fail fast from now on and the supervisor reconnects.

        `generation` ties a report to one connection, so a late end-of-stream of an old
        connection never takes down its successor.
        """
        if generation is not None and generation != self._generation:
            return
        if self._stop.is_set():
            self._broken.set()
            return
        self.client = None
        if self.state is ServerState.UP:
            log.warning("mcp_server_down", server=self.name, reason=reason)
            self._set_state(ServerState.DOWN, reason)
        self._broken.set()

    async def _supervise(self) -> None:
        from mcp import Client

        backoff = BACKOFF_FIRST_SECONDS
        loop = asyncio.get_running_loop()
        while not self._stop.is_set():
            self._broken.clear()
            self._generation += 1
            generation = self._generation
            up_since: float | None = None
            reason = "connection closed"
            try:
                async with (
                    asyncio.timeout(self.connect_timeout) as deadline,  # handshake and listing
                    contextlib.AsyncExitStack() as stack,
                    Client(
                        _watched(
                            self._target(stack),
                            functools.partial(self.mark_down, self._ended_reason(), generation=generation),
                        ),
                        read_timeout_seconds=self.call_timeout,
                    ) as client,
                ):
                    tools = await self._list_tools(client)
                    deadline.reschedule(None)
                    if self._broken.is_set():  # it died right after answering
                        raise ConnectionError("the server closed the connection after listing its tools")
                    self.client = client
                    self.connects += 1
                    self.tool_count = len(tools)
                    self.on_tools(self, tools)
                    self._set_state(ServerState.UP, None)
                    up_since = loop.time()
                    log.info("mcp_connected", server=self.name, tools=len(tools), connects=self.connects)
                    self.attempted.set()
                    await self._watch(client, generation)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # the transports raise ExceptionGroups
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                reason = _describe(exc)
                if up_since is None and not self._stop.is_set():
                    log.warning(
                        "mcp_connect_failed", server=self.name, error=reason, retry_in=round(backoff, 2)
                    )
            finally:
                self.client = None
                self.attempted.set()
            if self._stop.is_set():
                break
            if up_since is not None:
                self.mark_down(self.down_reason or reason)
                if loop.time() - up_since >= STABLE_AFTER_SECONDS:
                    backoff = BACKOFF_FIRST_SECONDS
            elif self.state is not ServerState.DOWN:
                self._set_state(ServerState.DOWN, reason)
            else:
                self.down_reason = reason
            await self._sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, BACKOFF_MAX_SECONDS)

    async def _watch(self, client: Any, generation: int) -> None:
        """Return when the connection is dead: end of stream, a failed probe, a failed call, stop."""
        from mcp import MCPError

        while not self._broken.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.probe_interval):
                    await self._broken.wait()
            if self._broken.is_set():
                return
            try:
                async with asyncio.timeout(self.probe_timeout):
                    await client.list_tools(cache_mode="bypass")
            except TimeoutError:
                self.mark_down(
                    f"no answer to a liveness probe within {self.probe_timeout:g}s", generation=generation
                )
            except MCPError as exc:
                if exc.code == _CONNECTION_CLOSED:
                    self.mark_down(f"liveness probe: {exc}", generation=generation)
                # any other error is an answer: the server is alive
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.mark_down(f"liveness probe failed: {_describe(exc)}", generation=generation)

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):  # not wait_for: on 3.11 it can swallow a cancel
            async with asyncio.timeout(seconds):
                await self._stop.wait()

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

    def _ended_reason(self) -> str:
        if self.config.command is not None:
            return "its process exited"
        return "it closed the connection"

    def _unavailable(self) -> str:
        if self.state is ServerState.CONNECTING:
            return f"MCP server {self.name!r} is still connecting; try again shortly"
        why = f" ({self.down_reason})" if self.down_reason else ""
        return f"MCP server {self.name!r} is down{why}; chatgate is reconnecting, try again later"

    async def call(self, remote_name: str, arguments: dict[str, Any]) -> str:
        from mcp import MCPError

        client = self.client
        if client is None:
            raise ToolError(self._unavailable())
        generation = self._generation
        try:
            async with asyncio.timeout(self.call_timeout):
                result = await client.call_tool(remote_name, arguments)
        except TimeoutError as exc:
            self.mark_down(f"a call got no answer within {self.call_timeout:g}s", generation=generation)
            raise ToolError(f"MCP server {self.name!r} did not answer within {self.call_timeout:g}s") from exc
        except MCPError as exc:
            limit = oversized_limit(str(exc))
            if limit is not None:  # the answer was dropped unread past the cap; the connection is fine
                log.warning("mcp_result_over_limit", server=self.name, tool=remote_name, limit=limit)
                raise ToolError(
                    f"MCP server {self.name!r}: tool {remote_name!r} result over {limit} bytes"
                    " (MCP_RESULT_MAX_BYTES); ask for less"
                ) from exc
            if exc.code == _CONNECTION_CLOSED:
                self.mark_down(f"connection closed during a call: {exc}", generation=generation)
                raise ToolError(f"MCP server {self.name!r} went down during the call ({exc})") from exc
            raise ToolError(f"MCP server {self.name!r}: {exc}") from exc
        except OSError as exc:
            self.mark_down(f"connection failed: {exc!r}", generation=generation)
            raise ToolError(f"MCP server {self.name!r} connection failed: {exc!r}") from exc
        text, is_error = result_text(result)
        if is_error:
            raise ToolError(text or f"tool {remote_name!r} on MCP server {self.name!r} failed")
        return text


def _describe(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
