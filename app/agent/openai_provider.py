"""An OpenAI-compatible chat-completions provider (OpenAI, DeepSeek, Qwen, Ollama, vLLM …).

Built on the `openai` SDK's `AsyncOpenAI` with a configurable `base_url`. The SDK's own
retries are switched off (`max_retries=0`) and done here instead, so that the policy is
ours and visible: 429, 5xx, timeouts and connection errors are retried with exponential
backoff that honours `Retry-After`; after the last try a `ProviderError` is raised and
the run loop turns it into a clear message to the user. A fallback provider, if
configured, gets the request once the primary gave up.
"""

from __future__ import annotations

import asyncio
import email.utils
import random
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import openai
import structlog

from app import tracing
from app.agent.provider import DeltaCallback, PartialReplyError, ProviderReply, ToolSpec, Usage
from app.errors import ProviderError
from app.sessions.messages import ChatMessage

if TYPE_CHECKING:
    from app.config import Settings

log = structlog.get_logger(__name__)

_RETRYABLE_STATUS = frozenset({408, 409, 429})


def retry_after_seconds(headers: Any) -> float | None:
    """Parse `retry-after-ms` / `Retry-After` (seconds or an HTTP date); None if absent."""
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    parsed = email.utils.parsedate_to_datetime(raw) if raw else None
    if parsed is None:
        return None
    return max(0.0, parsed.timestamp() - time.time())


def describe_parts(parts: Sequence[dict[str, Any]]) -> str:
    """Text stand-ins for non-text parts, for models that only read text."""
    lines = []
    for part in parts:
        kind = part.get("type")
        if kind == "image":
            where = part.get("url") or ("inline " + (part.get("mime_type") or "image"))
            lines.append(f"[image: {where}{_saved(part)}]")
        elif kind == "file":
            lines.append(f"[file: {part.get('name') or part.get('url') or 'attachment'}{_saved(part)}]")
        elif kind == "mention":
            lines.append(f"[mention: {part.get('user_id')}]")
        elif kind == "reply_to":
            lines.append(f"[in reply to message {part.get('message_id')}]")
    return "\n".join(lines)


def _saved(part: dict[str, Any]) -> str:
    """Where a received file is in the session's workspace (`app.pipeline.inbox_files`)."""
    path = part.get("workspace_path")
    return f"; saved in your workspace as {path}, readable with read_file" if path else ""


def _image_url(part: dict[str, Any]) -> str | None:
    """What the model can fetch or read: an http(s) URL or the data itself.

    A platform-internal reference (`telegram-file:<id>`) is not a URL the model can use;
    such a part is described in text instead.
    """
    url = str(part.get("url") or "")
    if url.startswith(("http://", "https://", "data:")):
        return url
    if part.get("data_base64"):
        return f"data:{part.get('mime_type') or 'image/png'};base64,{part['data_base64']}"
    return None


def to_openai_message(message: ChatMessage, *, vision: bool) -> dict[str, Any]:
    """One history message as the chat-completions API takes it.

    User messages with image parts become content arrays when the model reads images;
    otherwise every non-text part is described in text, so nothing is silently lost.
    """
    out = message.to_provider()
    if message.role != "user" or not message.parts:
        return out
    images = [u for p in message.parts if p.get("type") == "image" and (u := _image_url(p))]
    others = [p for p in message.parts if not (vision and p.get("type") == "image" and _image_url(p))]
    described = describe_parts(others)
    shown = [p for p in message.parts if p not in others and p.get("workspace_path")]
    if shown:  # images the model sees: where they are kept too
        described = "\n".join([described, *(f"[image{_saved(p)}]" for p in shown)]).strip()
    text = "\n".join(t for t in (message.content or "", described) if t)
    if vision and images:
        content: list[dict[str, Any]] = []
        if text:
            content.append({"type": "text", "text": text})
        content.extend({"type": "image_url", "image_url": {"url": u}} for u in images)
        out["content"] = content
    else:
        out["content"] = text
    return out


def answer_images(message: Any) -> tuple[str | None, tuple[dict[str, Any], ...]]:
    """The answer's text and its images as image parts.

    Some compatible servers answer with a content list (`text` and `image_url` items, as
    in requests) or an `images` list beside the content (OpenRouter's image models); an
    image is kept as an image part (a `data:` URL as its bytes), not flattened to text.
    """
    raw = message.content
    extra = getattr(message, "model_extra", None) or {}
    items: list[Any] = list(extra.get("images") or ())
    if isinstance(raw, list):
        texts = [str(i.get("text") or "") for i in raw if isinstance(i, dict) and i.get("type") == "text"]
        items = [i for i in raw if isinstance(i, dict) and i.get("type") != "text"] + items
        raw = "".join(texts) or None
    parts = tuple(p for p in (_image_part(i) for i in items) if p is not None)
    return raw, parts


def _image_part(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or item.get("type") not in ("image_url", "image"):
        return None
    ref = item.get("image_url")
    url = str((ref.get("url") if isinstance(ref, dict) else ref) or item.get("url") or "")
    match = _DATA_URL.match(url)
    if match:
        return {"type": "image", "data_base64": match["data"], "mime_type": match["mime"]}
    if url.startswith(("http://", "https://")):
        return {"type": "image", "url": url}
    return None


_DATA_URL = re.compile(r"^data:(?P<mime>image/[\w.+-]+);base64,(?P<data>[A-Za-z0-9+/=\s]+)$")


class _StreamAccumulator:
    """Rebuilds one assistant message from streamed chunks.

    Tool-call deltas are keyed by `index`: the first delta of a call carries its id and
    name, later ones only pieces of the arguments string.
    """

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.usage = Usage()
        self.model: str | None = None
        self.images: list[Any] = []  # image items of the answer (`answer_images`)
        self.size = 0  # characters of text and tool-call arguments so far

    def add(self, chunk: Any) -> str | None:
        if getattr(chunk, "model", None):
            self.model = chunk.model
        if getattr(chunk, "usage", None):
            self.usage = Usage(
                prompt_tokens=chunk.usage.prompt_tokens or 0,
                completion_tokens=chunk.usage.completion_tokens or 0,
                cached_tokens=cached_tokens(chunk.usage),
            )
        if not chunk.choices:
            return None
        delta = chunk.choices[0].delta
        for tc in delta.tool_calls or ():
            slot = self.calls.setdefault(tc.index, {"id": "", "name": "", "arguments": []})
            if tc.id:
                slot["id"] = tc.id
            if tc.function is not None:
                if tc.function.name:
                    slot["name"] += tc.function.name
                if tc.function.arguments:
                    slot["arguments"].append(tc.function.arguments)
                    self.size += len(tc.function.arguments)
        text, images = answer_images(delta)
        self.images.extend(images)
        if text:
            self.text.append(text)
            self.size += len(text)
            return text
        return None

    def reply(self) -> ProviderReply:
        calls = tuple(
            {
                "id": slot["id"],
                "type": "function",
                "function": {"name": slot["name"], "arguments": "".join(slot["arguments"]) or "{}"},
            }
            for _, slot in sorted(self.calls.items())
        )
        return ProviderReply(
            content="".join(self.text) or None,
            tool_calls=calls,
            usage=self.usage,
            model=self.model,
            parts=tuple(self.images),
        )


class OpenAIProvider:
    """Chat completions with tools and streaming over any OpenAI-compatible endpoint."""

    def __init__(
        self,
        *,
        base_url: str | None,
        api_key: str | None,
        model: str,
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        stream: bool = True,
        vision: bool = False,
        fallback: OpenAIProvider | None = None,
        name: str = "openai",
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        answer_max_chars: int = 200_000,
    ) -> None:
        self.name = name
        # A model (or a server) that never stops talking must not grow memory without end.
        self.answer_max_chars = answer_max_chars
        self.model = model
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.stream = stream
        self.vision = vision
        self.fallback = fallback
        self._sleep = sleep
        # Some servers (older vLLM, llama.cpp) refuse `stream_options`; then usage is
        # simply not reported for streamed answers. Decided per model, and only when a
        # request without it succeeded right after the refusal: any other 400 (a wrong key
        # behind a proxy, a context too long) must not switch usage off for good.
        self._no_stream_usage: set[str] = set()
        # Ollama, vLLM and llama.cpp accept any key; the SDK refuses an empty one.
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=0
        )
        self._chat: Any = None

    async def _completions(self) -> Any:
        """The SDK's chat-completions resource. Its first use imports the SDK's chat modules
        (~0.2 s of CPU): in a thread, so the event loop (other sessions, lease renewals)
        goes on meanwhile."""
        if self._chat is None:
            self._chat = await asyncio.to_thread(lambda: self.client.chat.completions)
        return self._chat

    @classmethod
    def from_settings(cls, settings: Settings) -> OpenAIProvider:
        common: dict[str, Any] = dict(
            timeout=settings.llm_timeout_seconds,
            max_retries=settings.llm_max_retries,
            backoff_base=settings.llm_backoff_base_seconds,
            backoff_max=settings.llm_backoff_max_seconds,
            stream=settings.llm_stream,
            vision=settings.llm_vision,
            answer_max_chars=settings.llm_answer_max_chars,
        )
        fallback = None
        if settings.llm_fallback_base_url or settings.llm_fallback_model:
            fallback = cls(
                base_url=settings.llm_fallback_base_url or settings.llm_base_url,
                api_key=settings.llm_fallback_api_key or settings.llm_api_key,
                model=settings.llm_fallback_model or settings.llm_model,
                name="openai-fallback",
                **common,
            )
        return cls(
            base_url=settings.llm_base_url,
            api_key=settings.llm_api_key,
            model=settings.llm_model,
            fallback=fallback,
            **common,
        )

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ProviderReply:
        try:
            return await self._complete_with_retries(messages, tools, model=model, on_delta=on_delta)
        except ProviderError as exc:
            if self.fallback is None or isinstance(exc, PartialReplyError):
                raise
            log.warning("provider_fallback", error=exc.detail, fallback=self.fallback.model)
            # The per-channel model names the primary's model; the fallback uses its own.
            return await self.fallback.complete(messages, tools, on_delta=on_delta)

    async def _complete_with_retries(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None,
        on_delta: DeltaCallback | None,
    ) -> ProviderReply:
        body: dict[str, Any] = {"messages": [to_openai_message(m, vision=self.vision) for m in messages]}
        if tools:
            body["tools"] = [t.to_provider() for t in tools]
        # The history and the tools go in `extra_body`, which the SDK sends as given
        # (documented: it takes precedence over the named arguments). Passed as
        # `messages=`, the SDK first walks every message against its typed schema: about
        # 0.13 ms of event-loop time per message on every model call (11 ms for 81
        # messages), while ours are already plain JSON in the API's shape.
        request: dict[str, Any] = {"model": model or self.model, "messages": [], "extra_body": body}
        with_usage = request["model"] not in self._no_stream_usage
        attempt = 0
        while True:
            emitted = False

            async def _delta(text: str) -> None:
                nonlocal emitted
                emitted = True
                if on_delta is not None:
                    await on_delta(text)

            try:
                if not self.stream:
                    return await self._whole(request)
                reply = await self._streamed(request, _delta, with_usage=with_usage)
                if not with_usage and request["model"] not in self._no_stream_usage:
                    # Refused with `stream_options`, answered without: this endpoint's model
                    # does not know the field.
                    log.info("provider_without_stream_options", model=request["model"])
                    self._no_stream_usage.add(request["model"])
                return reply
            except openai.APIStatusError as exc:
                status = exc.status_code
                if status == 400 and self.stream and with_usage and not emitted:
                    with_usage = False  # once: is it the field, or the request itself?
                    continue
                retryable = status in _RETRYABLE_STATUS or status >= 500
                wait = retry_after_seconds(exc.response.headers)
                detail = f"HTTP {status} from the model API: {_short(exc.message)}"
            except (openai.APIConnectionError, openai.APITimeoutError) as exc:
                status, retryable, wait = None, True, None
                detail = f"model API not reachable: {_short(str(exc))}"
            except openai.APIError as exc:  # malformed stream or body
                status, retryable, wait = None, True, None
                detail = f"bad answer from the model API: {_short(str(exc))}"
            if emitted:
                # Text already reached the user's screen: a retry would repeat it.
                raise PartialReplyError(detail, status=status, retryable=False)
            if not retryable or attempt >= self.max_retries:
                raise ProviderError(detail, status=status, retryable=retryable)
            delay = self._backoff(attempt, wait)
            log.info("provider_retry", attempt=attempt + 1, status=status, delay=round(delay, 3))
            await self._sleep(delay)
            attempt += 1

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.backoff_max)
        exp = self.backoff_base * (2**attempt)
        return min(self.backoff_max, exp * (0.75 + random.random() / 2))

    async def _whole(self, request: dict[str, Any]) -> ProviderReply:
        resp = await (await self._completions()).create(**request, extra_headers=tracing.headers())
        if not resp.choices:
            raise ProviderError("the model API answered without a choice", retryable=True)
        msg = resp.choices[0].message
        calls = tuple(
            {
                "id": tc.id,
                "type": "function",
                "function": {"name": tc.function.name, "arguments": tc.function.arguments or "{}"},
            }
            for tc in msg.tool_calls or ()
            if getattr(tc, "function", None) is not None
        )
        usage = Usage(
            prompt_tokens=resp.usage.prompt_tokens if resp.usage else 0,
            completion_tokens=resp.usage.completion_tokens if resp.usage else 0,
            cached_tokens=cached_tokens(resp.usage) if resp.usage else 0,
        )
        content, images = answer_images(msg)
        if content is not None and len(content) > self.answer_max_chars:
            content, calls = bounded_answer(content, self.answer_max_chars), ()
        return ProviderReply(content=content, tool_calls=calls, usage=usage, model=resp.model, parts=images)

    async def _streamed(
        self, request: dict[str, Any], on_delta: DeltaCallback, *, with_usage: bool
    ) -> ProviderReply:
        acc = _StreamAccumulator()
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if with_usage else {}
        extra["extra_headers"] = tracing.headers()  # W3C traceparent of the model-call span
        stream = await (await self._completions()).create(**request, stream=True, **extra)
        async with stream:
            async for chunk in stream:
                text = acc.add(chunk)
                if text:
                    await on_delta(text)
                if acc.size > self.answer_max_chars:
                    # Stop reading (closing the stream ends the request): the answer so far,
                    # cut, without the tool calls whose arguments may be incomplete.
                    log.warning("model_answer_cut", chars=acc.size, limit=self.answer_max_chars)
                    reply = acc.reply()
                    return ProviderReply(
                        content=bounded_answer(reply.content or "", self.answer_max_chars),
                        usage=reply.usage,
                        model=reply.model,
                        parts=reply.parts,
                    )
        return acc.reply()

    async def aclose(self) -> None:
        await self.client.close()
        if self.fallback is not None:
            await self.fallback.aclose()


def cached_tokens(usage: Any) -> int:
    """Prompt tokens served from the provider's cache (`prompt_tokens_details.cached_tokens`,
    as OpenAI, DeepSeek's compatible API and LiteLLM report them), 0 when not reported."""
    details = getattr(usage, "prompt_tokens_details", None)
    value = getattr(details, "cached_tokens", None) if details is not None else None
    return int(value) if isinstance(value, int) else 0


ANSWER_CUT_MARKER = "\n\n[answer cut at {limit} characters]"


def bounded_answer(text: str, limit: int) -> str:
    """An answer no longer than `limit` characters (and a marker saying it was cut)."""
    return text if len(text) <= limit else text[:limit] + ANSWER_CUT_MARKER.format(limit=limit)


def _short(text: str, limit: int = 300) -> str:
    return text if len(text) <= limit else text[:limit] + "…"
