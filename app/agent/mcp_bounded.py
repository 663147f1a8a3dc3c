"""Bounded reads from MCP servers: no answer is held whole past `MCP_RESULT_MAX_BYTES`.

The SDK reads a streamable-HTTP answer whole before anything of ours sees it (a JSON
body with `response.aread()`, an SSE event up to its `max_sse_event_size`), so a server
answering 200 MB costs 200 MB (and its parsed copies) before `TOOL_RESULT_MAX_CHARS`
cuts it. Here the HTTP client the SDK uses is built with a transport whose response
bodies stop being read past the cap, and SSE events get the same cap, so the transient
peak per call is about the cap. An answer over it becomes a tool error naming the cap;
the connection and its MCP session stay usable.

stdio: the SDK's `stdio_client` buffers a line of the server's stdout without any limit
and exposes none, so `bounded_stdio_client` is our own stdio transport with a bounded
line reader: a line over the cap is discarded as it arrives; an answer is replaced by a
JSON-RPC error for the request it belonged to (its id is read from the line's head,
where the SDK's servers write it), a server's request or notification is dropped, and a
line that shows neither closes the connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx2
import structlog

log = structlog.get_logger(__name__)

OVERSIZED = "result over {limit} bytes"
# What the SDK and we say when an answer was over the cap (SSE: httpx2's SSEError).
_OVER = re.compile(r"result over (\d+) bytes|exceeded the (\d+) byte limit")
# A JSON-RPC answer's id near the start of its line: `{"jsonrpc":"2.0","id":7,...`.
_ID = re.compile(rb'"id"\s*:\s*(-?\d+|"(?:[^"\\]|\\.)*")')
_ID_WINDOW = 256
_EXIT_GRACE_SECONDS = 2.0  # after stdin closes, and after each signal


class ResultTooLarge(httpx2.StreamError):
    """A response body went past the cap; reading stopped there.

    An `httpx2.StreamError`, so the SDK's JSON-response path turns it into a JSON-RPC
    error for the request instead of tearing the transport down.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(OVERSIZED.format(limit=limit))
        self.limit = limit


def oversized_limit(message: str) -> int | None:
    """The cap an error message says an answer went over, or None."""
    match = _OVER.search(message)
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


class _CappedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResultTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedTransport(httpx2.AsyncBaseTransport):
    """Bodies that carry one whole JSON-RPC answer stop being read past `limit`.

    Event streams (a POST answered with SSE, the long-lived GET stream) are bounded per
    event by the SDK's `max_sse_event_size` instead: each event is handled and dropped,
    and a stream's total grows for as long as it lives. The cap is raised while the
    body is read, never from here: the SDK turns a read error into a JSON-RPC error for
    the request, while an error from sending ends the whole transport.
    """

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").lower()
        if request.method == "POST" and not content_type.startswith("text/event-stream"):
            assert isinstance(response.stream, httpx2.AsyncByteStream)
            response.stream = _CappedStream(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def capped_http_client(headers: dict[str, str], limit: int) -> httpx2.AsyncClient:
    """The SDK's default client (its timeouts), reading at most `limit` bytes per answer.

    `identity`: the cap counts bytes on the wire, so a compressed body must not expand
    past it after the count.
    """
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    return httpx2.AsyncClient(
        headers={**headers, "Accept-Encoding": "identity"},
        timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT),
        transport=CappedTransport(httpx2.AsyncHTTPTransport(), limit),
    )


class _BoundedLines:
    """Lines of a byte stream, none held past `limit` bytes: a longer one is skipped as it
    arrives and reported as `(None, head)` with its first bytes."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[tuple[bytes | None, bytes]]:
        buffer = bytearray()
        head = b""
        skipping = False
        async for chunk in self._stream:
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                piece = chunk[start:] if end < 0 else chunk[start:end]
                if skipping:
                    pass
                elif len(buffer) + len(piece) > self._limit:
                    head = bytes((buffer + piece)[:_ID_WINDOW])
                    buffer.clear()
                    skipping = True
                else:
                    buffer += piece
                if end < 0:
                    break
                if skipping:
                    yield None, head
                    skipping = False
                else:
                    yield bytes(buffer), b""
                    buffer.clear()
                start = end + 1


def _oversized_answer(head: bytes, limit: int) -> tuple[Any | None, bool]:
    """What to do with a skipped line, by its head: an answer to one of our requests gets
    a JSON-RPC error in its place; the server's own request or notification is dropped
    (logged); a line that shows neither closes the connection. -> (message, keep going)"""
    from mcp.shared.message import SessionMessage
    from mcp_types import INTERNAL_ERROR, ErrorData, JSONRPCError

    if b'"method"' in head:
        return None, True  # not an answer: nobody here waits for it by id
    match = _ID.search(head)
    if match is None:
        return None, False
    request_id = json.loads(match.group(1))
    error = ErrorData(code=INTERNAL_ERROR, message=OVERSIZED.format(limit=limit))
    return SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id, error=error)), True


@contextlib.asynccontextmanager
async def bounded_stdio_client(
    command: list[str], env: dict[str, str], cwd: str | None, limit: int
) -> AsyncIterator[tuple[Any, Any]]:
    """An MCP stdio transport (newline-delimited JSON-RPC over the server's stdin and
    stdout, like the SDK's `stdio_client`) whose reader holds at most `limit` bytes."""
    import sys

    from mcp.shared.message import SessionMessage
    from mcp_types import jsonrpc_message_adapter

    # Its own process group, so teardown reaches the servers' children too.
    process = await anyio.open_process(command, env=env, cwd=cwd, stderr=sys.stderr, start_new_session=True)
    read_writer, read_stream = anyio.create_memory_object_stream[Any](0)
    write_stream, write_reader = anyio.create_memory_object_stream[Any](0)

    async def reader() -> None:
        assert process.stdout is not None
        async with read_writer:
            try:
                async for line, head in _BoundedLines(process.stdout, limit):
                    if line is None:
                        answer, keep = _oversized_answer(head, limit)
                        log.warning("mcp_stdio_line_over_limit", limit=limit, answered=answer is not None)
                        if not keep:
                            return  # a line we cannot place: end the connection
                        if answer is not None:
                            await read_writer.send(answer)
                        continue
                    if not line.strip():
                        continue
                    message: Any
                    try:
                        message = SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
                    except ValueError as exc:
                        message = exc
                    await read_writer.send(message)
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                return

    async def writer() -> None:
        assert process.stdin is not None
        async with write_reader:
            try:
                async for session_message in write_reader:
                    data = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    await process.stdin.send((data + "\n").encode())
            except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
                await read_writer.aclose()

    async with anyio.create_task_group() as tg:
        tg.start_soon(reader)
        tg.start_soon(writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                await write_stream.aclose()
                if process.stdin is not None:
                    with contextlib.suppress(Exception):
                        await process.stdin.aclose()
                with anyio.move_on_after(_EXIT_GRACE_SECONDS):
                    await process.wait()
                # As the SDK does: the server and whatever it started (npx → node) go.
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    if process.returncode is not None:
                        break
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, sig)
                    with anyio.move_on_after(_EXIT_GRACE_SECONDS):
                        await process.wait()
                await read_stream.aclose()
            tg.cancel_scope.cancel()
