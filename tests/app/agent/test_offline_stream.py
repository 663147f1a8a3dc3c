"""The offline provider streams its answers in pieces, as a real model does."""

from __future__ import annotations

from app.agent.offline import OfflineProvider
from app.agent.provider import ToolSpec
from app.sessions.messages import ChatMessage

TIME_TOOL = ToolSpec("current_time", "The time.", {"type": "object", "properties": {}})


async def test_answers_arrive_in_pieces_that_add_up_to_the_answer() -> None:
    provider = OfflineProvider()
    for text in ("hello there, how are you?", "你好，今天怎么样"):
        pieces: list[str] = []

        async def collect(piece: str, into: list[str] = pieces) -> None:
            into.append(piece)

        reply = await provider.complete([ChatMessage(role="user", content=text)], [], on_delta=collect)
        assert len(pieces) > 3
        assert "".join(pieces) == reply.content == f"You said: {text}"


async def test_an_answer_from_a_tool_result_streams_too() -> None:
    provider = OfflineProvider()
    pieces: list[str] = []

    async def collect(piece: str) -> None:
        pieces.append(piece)

    history = [ChatMessage(role="user", content="what time is it?")]
    first = await provider.complete(history, [TIME_TOOL], on_delta=collect)
    assert first.tool_calls and not pieces  # a tool call is not streamed text
    call = first.tool_calls[0]
    history += [
        ChatMessage(role="assistant", content=None, tool_calls=first.tool_calls),
        ChatMessage(
            role="tool", content='{"iso": "2026-01-01"}', tool_call_id=call["id"], name="current_time"
        ),
    ]
    reply = await provider.complete(history, [TIME_TOOL], on_delta=collect)
    assert len(pieces) > 2 and "".join(pieces) == reply.content


async def test_a_long_answer_streams_in_a_bounded_number_of_pieces() -> None:
    provider = OfflineProvider()
    pieces: list[str] = []

    async def collect(piece: str) -> None:
        pieces.append(piece)

    text = "long " * 4000
    reply = await provider.complete([ChatMessage(role="user", content=text)], [], on_delta=collect)
    assert 1 < len(pieces) <= 32 and "".join(pieces) == reply.content
