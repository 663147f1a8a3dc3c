"""The run loop on its own: the last check before a request, and bounded iterations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from app.agent.loop import AgentRunner, RunHooks, RunRecord
from app.agent.provider import ProviderReply, ToolSpec
from app.agent.tools import ToolContext, ToolRegistry, builtin_tools
from app.sessions.messages import ChatMessage, tool_call


@dataclass
class Recorder:
    replies: list[ProviderReply]
    seen: list[list[ChatMessage]] = field(default_factory=list)
    name: str = "recorder"

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        self.seen.append(list(messages))
        return (
            self.replies.pop(0)
            if self.replies
            else ProviderReply(content=None, tool_calls=(tool_call("c", "current_time", {}),))
        )

    async def aclose(self) -> None:
        return None


async def _zero() -> int:
    return 0


CTX = ToolContext(
    session_id=1,
    session_key="k",
    channel="t",
    chat_id="c",
    sender_id="u",
    thread_id=None,
    message_count=_zero,
)


def hooks_over(window: list[ChatMessage], finished: list[tuple[ChatMessage, RunRecord]]) -> RunHooks:
    async def load_window() -> list[ChatMessage]:
        return list(window)

    async def append(new: list[ChatMessage]) -> None:
        window.extend(new)

    async def finish(final: ChatMessage, record: RunRecord) -> None:
        finished.append((final, record))

    return RunHooks(load_window=load_window, append=append, finish=finish)


async def test_an_illegal_window_is_cut_to_a_legal_one_before_the_request() -> None:
    broken = [
        ChatMessage(role="tool", content="{}", tool_call_id="orphan", name="x"),
        ChatMessage(role="user", content="first"),
        ChatMessage(role="assistant", tool_calls=(tool_call("open", "current_time", {}),)),
        ChatMessage(role="user", content="second"),
    ]
    provider = Recorder([ProviderReply(content="fine")])
    finished: list[tuple[ChatMessage, RunRecord]] = []
    await AgentRunner(provider, ToolRegistry(builtin_tools()), system_prompt="sys").run(
        hooks_over(broken, finished), CTX
    )
    [request] = provider.seen
    assert [(m.role, m.content) for m in request] == [("system", "sys"), ("user", "second")]
    assert finished[0][0].content == "fine"


async def test_iterations_are_bounded() -> None:
    provider = Recorder([])  # always asks for another tool call
    finished: list[tuple[ChatMessage, RunRecord]] = []
    window = [ChatMessage(role="user", content="loop forever")]
    record = await AgentRunner(
        provider, ToolRegistry(builtin_tools()), system_prompt="s", max_iterations=3
    ).run(hooks_over(window, finished), CTX)
    assert len(provider.seen) == 3
    assert record.outcome == "max_iterations" and record.iterations == 3
    assert finished[0][0].content == "I stopped after 3 steps without a final answer."
