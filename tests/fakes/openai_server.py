"""A real local HTTP server speaking the OpenAI chat-completions API, scripted per test.

`FakeOpenAI` answers `POST /v1/chat/completions` (and `/chat/completions`) from a queue of
scripted `Reply`s: plain answers, tool calls, HTTP errors with headers (429 with
`Retry-After`, 500 …), delays, or a hold until the test releases it. Streaming requests
(`"stream": true`) get server-sent events in the published chunk format, with tool-call
arguments split over several deltas. Every request body is recorded, so tests assert on
exactly what the model was sent.

When the queue is empty the server answers with `default` (a `Reply` or a function of
the request body), so long-running tests need not script every call.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.timing import scaled


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str = field(default_factory=lambda: "call_" + uuid.uuid4().hex[:10])

    @property
    def arguments_json(self) -> str:
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    error_body: dict[str, Any] | None = None
    delay: float = 0.0
    hold: asyncio.Event | None = None  # answer only once the test sets it
    prompt_tokens: int = 11
    completion_tokens: int = 7
    fail_mid_stream: bool = False  # send some text, then cut the connection
    chunk_delay: float = 0.0  # seconds between streamed pieces (a model writing slowly)
    model: str | None = None
    # An answer as a content list (text and image_url items) instead of `content`, and
    # images beside the content (OpenRouter's `images`), as some compatible servers send.
    content_items: list[dict[str, Any]] | None = None
    images: list[dict[str, Any]] | None = None


Responder = Callable[[dict[str, Any]], Reply]


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def calls(*tool_calls: ToolCall, content: str | None = None, **kw: Any) -> Reply:
    return Reply(content=content, tool_calls=list(tool_calls), **kw)


def error(status: int, retry_after: str | None = None, **kw: Any) -> Reply:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return Reply(status=status, headers=headers, **kw)


@dataclass
class Recorded:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages", []))

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.body.get("tools", [])]


class FakeOpenAI:
    def __init__(
        self,
        default: Reply | Responder | None = None,
        chunk_size: int = 4,
        reject_stream_options: bool = False,
    ) -> None:
        self.reject_stream_options = reject_stream_options  # like servers that predate the field
        self.script: list[Reply] = []
        self.default = default if default is not None else Reply(content="ok")
        self.chunk_size = chunk_size
        self.requests: list[Recorded] = []
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""  # …/v1, what LLM_BASE_URL takes
        self.transcript = "this is a voice note"  # what audio/transcriptions answers
        # The audio's seconds it reports as usage (as OpenAI does for whisper-1); None: no usage.
        self.transcript_seconds: float | None = None
        self.transcriptions: list[dict[str, Any]] = []

    # --- scripting ------------------------------------------------------------------

    def enqueue(self, *replies: Reply) -> None:
        self.script.extend(replies)

    async def wait_requests(self, count: int, timeout: float = 10) -> list[Recorded]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.requests) >= count), scaled(timeout)
            )
        return list(self.requests)

    # --- serving --------------------------------------------------------------------

    async def _models(self, _request: web.Request) -> web.Response:
        """`GET /v1/models` as the API answers it (what `chatgate doctor` asks)."""
        model = {"id": "gpt-4o-mini", "object": "model", "created": 1715367049, "owned_by": "system"}
        return web.json_response({"object": "list", "data": [model]})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
        async with self._changed:
            self.requests.append(
                Recorded(request.path, {k.lower(): v for k, v in request.headers.items()}, body, time.time())
            )
            self._changed.notify_all()
        if self.reject_stream_options and "stream_options" in body:
            return web.json_response({"error": {"message": "unknown field stream_options"}}, status=400)
        if self.script:
            reply = self.script.pop(0)
        elif callable(self.default):
            reply = self.default(body)
        else:
            reply = self.default
        if reply.hold is not None:
            await reply.hold.wait()
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            payload = reply.error_body or {
                "error": {"message": f"scripted {reply.status}", "type": "server_error", "code": None}
            }
            return web.json_response(payload, status=reply.status, headers=reply.headers)
        model = reply.model or body.get("model", "fake-model")
        if body.get("stream"):
            return await self._stream(request, body, reply, model)
        return web.json_response(self._completion(reply, model))

    def _completion(self, reply: Reply, model: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.content_items is not None:
            message["content"] = reply.content_items
        if reply.images is not None:
            message["images"] = reply.images
        if reply.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json}}
                for c in reply.tool_calls
            ]
        return {
            "id": "chatcmpl-" + uuid.uuid4().hex[:12],
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if reply.tool_calls else "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": reply.prompt_tokens,
                "completion_tokens": reply.completion_tokens,
                "total_tokens": reply.prompt_tokens + reply.completion_tokens,
            },
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], reply: Reply, model: str
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        cid = "chatcmpl-" + uuid.uuid4().hex[:12]

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            return {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
            }

        async def send(data: dict[str, Any]) -> None:
            await resp.write(f"data: {json.dumps(data)}\n\n".encode())

        await send(chunk({"role": "assistant", "content": ""}))
        content = reply.content or ""
        pieces = [content[i : i + self.chunk_size] for i in range(0, len(content), self.chunk_size)]
        for n, piece in enumerate(pieces):
            if reply.chunk_delay and n:
                await asyncio.sleep(reply.chunk_delay)
            await send(chunk({"content": piece}))
            if reply.fail_mid_stream and n == 0:
                assert request.transport is not None
                request.transport.close()
                return resp
        if reply.content_items is not None:
            await send(chunk({"content": reply.content_items}))
        if reply.images is not None:
            await send(chunk({"images": reply.images}))
        for index, call in enumerate(reply.tool_calls):
            args = call.arguments_json
            await send(
                chunk(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": call.id,
                                "type": "function",
                                "function": {"name": call.name, "arguments": ""},
                            }
                        ]
                    }
                )
            )
            for i in range(0, len(args), self.chunk_size):
                await send(
                    chunk(
                        {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": args[i : i + self.chunk_size]}}
                            ]
                        }
                    )
                )
        await send(chunk({}, "tool_calls" if reply.tool_calls else "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            await send(
                {
                    "id": cid,
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [],
                    "usage": {
                        "prompt_tokens": reply.prompt_tokens,
                        "completion_tokens": reply.completion_tokens,
                        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                    },
                }
            )
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _transcribe(self, request: web.Request) -> web.Response:
        """`audio/transcriptions`: multipart `model` and `file`; answers `transcript`."""
        form = await request.post()
        upload = form.get("file")
        audio = upload.file.read() if isinstance(upload, web.FileField) else b""
        self.transcriptions.append({"model": form.get("model"), "audio": audio})
        body: dict[str, Any] = {"text": self.transcript}
        if self.transcript_seconds is not None:
            body["usage"] = {"type": "duration", "seconds": self.transcript_seconds}
        return web.json_response(body)

    async def __aenter__(self) -> FakeOpenAI:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_post("/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
