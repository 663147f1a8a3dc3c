"""`OpenAIProvider` with the real `openai` SDK against a real local fake of the API."""

from __future__ import annotations

import json
import time

import pytest

from app.agent.openai_provider import OpenAIProvider, retry_after_seconds, to_openai_message
from app.agent.provider import PartialReplyError, ToolSpec
from app.errors import ProviderError
from app.sessions.messages import ChatMessage, tool_call
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, error, text

TIME_TOOL = ToolSpec(
    "current_time",
    "The time.",
    {"type": "object", "properties": {"timezone": {"type": "string"}}},
)
USER = [ChatMessage(role="system", content="be brief"), ChatMessage(role="user", content="hi")]


def provider(fake: FakeOpenAI, **kw: object) -> OpenAIProvider:
    values: dict[str, object] = dict(
        base_url=fake.url, api_key="sk-test", model="gpt-test", backoff_base=0.01
    )
    values.update(kw)
    return OpenAIProvider(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("stream", [True, False])
async def test_tool_calls_are_rebuilt_exactly(stream: bool) -> None:
    long_args = {"timezone": "Europe/Berlin", "note": "x" * 50}
    async with FakeOpenAI(chunk_size=3) as fake:
        fake.enqueue(
            calls(
                ToolCall("current_time", long_args, id="call_AbC-123"),
                ToolCall("current_time", {}, id="call_second"),
                content="Let me check.",
            )
        )
        p = provider(fake, stream=stream)
        try:
            reply = await p.complete(USER, [TIME_TOOL])
        finally:
            await p.aclose()
    assert reply.content == "Let me check."
    assert [c["id"] for c in reply.tool_calls] == ["call_AbC-123", "call_second"]
    assert json.loads(reply.tool_calls[0]["function"]["arguments"]) == long_args
    assert reply.tool_calls[1]["function"] == {"name": "current_time", "arguments": "{}"}
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (11, 7)
    sent = fake.requests[0]
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.body["model"] == "gpt-test"
    assert sent.body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert sent.tool_names == ["current_time"]
    assert bool(sent.body.get("stream")) is stream


async def test_streamed_text_reaches_the_delta_callback_in_order() -> None:
    async with FakeOpenAI(chunk_size=5) as fake:
        fake.enqueue(text("The quick brown fox jumps."))
        p = provider(fake)
        deltas: list[str] = []

        async def on_delta(piece: str) -> None:
            deltas.append(piece)

        try:
            reply = await p.complete(USER, [], on_delta=on_delta, model="per-channel-model")
        finally:
            await p.aclose()
    assert "".join(deltas) == "The quick brown fox jumps." == reply.content
    assert len(deltas) > 3
    assert fake.requests[0].body["model"] == "per-channel-model"
    assert fake.requests[0].body["stream_options"] == {"include_usage": True}
    assert "tools" not in fake.requests[0].body


async def test_429_honours_retry_after_then_succeeds() -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(error(429, retry_after="1"), text("finally"))
        p = provider(fake, backoff_base=0.001)
        started = time.monotonic()
        try:
            reply = await p.complete(USER, [])
        finally:
            await p.aclose()
        waited = fake.requests[1].at - fake.requests[0].at
    assert reply.content == "finally"
    assert len(fake.requests) == 2
    assert waited >= 0.95  # the header said one second; our own backoff would be 1 ms
    assert time.monotonic() - started < 5


async def test_5xx_and_connection_errors_are_retried_with_backoff() -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(error(500), error(503), error(502), text("up again"))
        p = provider(fake, max_retries=3)
        try:
            reply = await p.complete(USER, [])
        finally:
            await p.aclose()
    assert reply.content == "up again"
    assert len(fake.requests) == 4


async def test_gives_up_with_provider_error_after_the_last_try() -> None:
    async with FakeOpenAI(default=error(500)) as fake:
        p = provider(fake, max_retries=2)
        try:
            with pytest.raises(ProviderError) as info:
                await p.complete(USER, [])
        finally:
            await p.aclose()
    assert len(fake.requests) == 3
    assert info.value.status == 500


async def test_a_4xx_is_not_retried() -> None:
    async with FakeOpenAI(default=error(400)) as fake:
        p = provider(fake, max_retries=3, stream=False)
        try:
            with pytest.raises(ProviderError) as info:
                await p.complete(USER, [])
        finally:
            await p.aclose()
    assert len(fake.requests) == 1
    assert info.value.status == 400 and not info.value.retryable


async def test_unreachable_endpoint_is_a_provider_error() -> None:
    async with FakeOpenAI() as fake:
        url = fake.url
    p = OpenAIProvider(base_url=url, api_key=None, model="m", max_retries=1, backoff_base=0.01)
    try:
        with pytest.raises(ProviderError, match="not reachable"):
            await p.complete(USER, [])
    finally:
        await p.aclose()


async def test_fallback_answers_when_the_primary_gives_up() -> None:
    async with FakeOpenAI(default=error(503)) as primary, FakeOpenAI() as backup:
        backup.enqueue(text("from the fallback"))
        fallback = provider(backup, model="backup-model")
        p = provider(primary, max_retries=1, fallback=fallback)
        try:
            reply = await p.complete(USER, [], model="channel-model")
        finally:
            await p.aclose()
    assert reply.content == "from the fallback"
    assert len(primary.requests) == 2
    assert backup.requests[0].body["model"] == "backup-model"


async def test_a_stream_cut_after_text_is_not_retried() -> None:
    async with FakeOpenAI(chunk_size=2) as fake:
        fake.enqueue(Reply(content="partial answer", fail_mid_stream=True), text("never sent"))
        p = provider(fake)
        seen: list[str] = []

        async def on_delta(piece: str) -> None:
            seen.append(piece)

        try:
            with pytest.raises(PartialReplyError):
                await p.complete(USER, [], on_delta=on_delta)
        finally:
            await p.aclose()
    assert seen == ["pa"]
    assert len(fake.requests) == 1


def test_retry_after_forms() -> None:
    assert retry_after_seconds({"retry-after": "2"}) == 2
    assert retry_after_seconds({"retry-after-ms": "1500"}) == 1.5
    assert retry_after_seconds({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) == 0
    assert retry_after_seconds({}) is None


def test_image_parts_become_content_arrays_only_for_vision_models() -> None:
    msg = ChatMessage(
        role="user",
        content="what is this?",
        parts=(
            {"type": "image", "url": "https://example.test/cat.png"},
            {"type": "image", "data_base64": "AAAA", "mime_type": "image/jpeg"},
            {"type": "file", "name": "report.pdf"},
        ),
    )
    vision = to_openai_message(msg, vision=True)
    assert vision["content"] == [
        {"type": "text", "text": "what is this?\n[file: report.pdf]"},
        {"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}},
        {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
    ]
    plain = to_openai_message(msg, vision=False)
    assert plain["content"] == (
        "what is this?\n[image: https://example.test/cat.png]\n[image: inline image/jpeg]\n[file: report.pdf]"
    )


def test_tool_messages_keep_their_ids() -> None:
    call = tool_call("call_Z9-x", "current_time", {})
    assistant = to_openai_message(ChatMessage(role="assistant", tool_calls=(call,)), vision=False)
    result = to_openai_message(
        ChatMessage(role="tool", content="{}", tool_call_id="call_Z9-x", name="current_time"), vision=False
    )
    assert assistant["tool_calls"][0]["id"] == "call_Z9-x"
    assert result == {"role": "tool", "content": "{}", "tool_call_id": "call_Z9-x"}


async def test_servers_without_stream_options_still_stream() -> None:
    async with FakeOpenAI(reject_stream_options=True) as fake:
        fake.enqueue(text("streamed anyway"), text("and again"))
        p = provider(fake, max_retries=0)
        try:
            first = await p.complete(USER, [])
            second = await p.complete(USER, [])
        finally:
            await p.aclose()
    assert (first.content, second.content) == ("streamed anyway", "and again")
    assert ["stream_options" in r.body for r in fake.requests] == [True, False, False]


async def test_a_400_that_is_not_about_stream_options_keeps_usage_on() -> None:
    """A wrong key behind a proxy or a context too long answers 400 with or without the
    field: usage stays on, and the next turn's tokens are counted."""
    async with FakeOpenAI() as fake:
        fake.enqueue(error(400), error(400), text("fine now", prompt_tokens=40, completion_tokens=5))
        p = provider(fake, max_retries=0)
        try:
            with pytest.raises(ProviderError, match="HTTP 400"):
                await p.complete(USER, [])
            later = await p.complete(USER, [])
        finally:
            await p.aclose()
    assert ["stream_options" in r.body for r in fake.requests] == [True, False, True]
    assert (later.usage.prompt_tokens, later.usage.completion_tokens) == (40, 5)


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_of_unbounded_length_is_cut(stream: bool) -> None:
    """A model that does not stop: the answer kept is bounded, the stream closed early."""
    endless = "word " * 400_000  # 2 MB
    async with FakeOpenAI(chunk_size=4096) as fake:
        fake.enqueue(calls(ToolCall("current_time", {"timezone": "UTC"}), content=endless))
        p = provider(fake, stream=stream, answer_max_chars=10_000)
        try:
            reply = await p.complete(USER, [TIME_TOOL])
        finally:
            await p.aclose()
    assert reply.content is not None
    assert reply.content.startswith("word word")
    assert 10_000 < len(reply.content) < 10_100
    assert reply.content.endswith("[answer cut at 10000 characters]")
    assert reply.tool_calls == ()  # a cut answer calls nothing (its arguments may be partial)
