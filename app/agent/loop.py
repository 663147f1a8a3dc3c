"""The run loop: model call, tool calls, model call … until a final answer.

Every message the loop produces is handed to `RunHooks.append` as soon as it exists,
and the final answer to `RunHooks.finish`, which commits it together with the reply and
the event status. A crash at any point therefore leaves a history that is legal after
`repair_interrupted` and a turn that can be resumed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from app.agent.provider import ChatProvider, ProviderReply
from app.agent.tools import ToolContext, ToolRegistry
from app.errors import LeaseLost, ProviderError
from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)

ContextSource = Callable[[ToolContext], Awaitable[str | None]]
"""Adds text to the system message of a run (recalled memory, operator facts …)."""

INTERRUPTED_RESULT = json.dumps({"error": "interrupted: the run stopped before this tool finished"})


@dataclass
class RunHooks:
    load_window: Callable[[], Awaitable[list[ChatMessage]]]
    append: Callable[[list[ChatMessage]], Awaitable[None]]
    finish: Callable[[ChatMessage, RunRecord], Awaitable[None]]


@dataclass
class RunRecord:
    provider: str
    model: str | None
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    outcome: str = "running"
    error: str | None = None
    started: float = field(default_factory=time.monotonic)

    def add_usage(self, reply: ProviderReply) -> None:
        self.iterations += 1
        self.prompt_tokens += reply.usage.prompt_tokens
        self.completion_tokens += reply.usage.completion_tokens
        if reply.model:
            self.model = reply.model


def repair_interrupted(tail: Sequence[ChatMessage]) -> list[ChatMessage]:
    """Tool results to append for calls a crashed run left unanswered (append-only repair)."""
    pending: dict[str, str] = {}
    for msg in tail:
        if msg.role == "assistant" and msg.tool_calls:
            pending = {tc["id"]: tc.get("function", {}).get("name", "") for tc in msg.tool_calls}
        elif msg.role == "tool":
            pending.pop(msg.tool_call_id or "", None)
        else:
            pending = {}
    return [
        ChatMessage(role="tool", content=INTERRUPTED_RESULT, tool_call_id=call_id, name=name)
        for call_id, name in pending.items()
    ]


class AgentRunner:
    def __init__(
        self,
        provider: ChatProvider,
        tools: ToolRegistry,
        *,
        system_prompt: str,
        max_iterations: int = 8,
        max_tool_result_chars: int = 16_000,
        context_sources: Sequence[ContextSource] = (),
    ) -> None:
        self.provider = provider
        self.tools = tools
        self.system_prompt = system_prompt
        self.max_iterations = max_iterations
        self.max_tool_result_chars = max_tool_result_chars
        self.context_sources = list(context_sources)

    async def run(self, hooks: RunHooks, tool_ctx: ToolContext, *, model: str | None = None) -> RunRecord:
        record = RunRecord(provider=self.provider.name, model=model)
        try:
            system = ChatMessage(role="system", content=await self._system_text(tool_ctx))
            for _ in range(self.max_iterations):
                window = await hooks.load_window()
                reply = await self.provider.complete([system, *window], self.tools.specs(), model=model)
                record.add_usage(reply)
                if not reply.tool_calls:
                    record.outcome = "ok"
                    await hooks.finish(ChatMessage(role="assistant", content=reply.content or ""), record)
                    return record
                await hooks.append(
                    [ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)]
                )
                for call in reply.tool_calls:
                    started = time.monotonic()
                    result = await self.tools.execute(call, tool_ctx)
                    if len(result) > self.max_tool_result_chars:
                        result = result[: self.max_tool_result_chars] + "\n[… truncated by chatgate]"
                    name = call.get("function", {}).get("name", "")
                    record.tool_calls.append(
                        {"id": call["id"], "name": name, "ms": round((time.monotonic() - started) * 1000)}
                    )
                    await hooks.append(
                        [ChatMessage(role="tool", content=result, tool_call_id=call["id"], name=name)]
                    )
            record.outcome = "max_iterations"
            text = f"I stopped after {self.max_iterations} steps without a final answer."
        except LeaseLost:
            raise
        except ProviderError as exc:
            log.warning("provider_failed", error=exc.detail, status=exc.status)
            record.outcome, record.error = "provider_error", exc.detail
            text = "Sorry, the model is not reachable right now. Please try again later."
        await hooks.finish(ChatMessage(role="assistant", content=text), record)
        return record

    async def _system_text(self, tool_ctx: ToolContext) -> str:
        parts = [self.system_prompt]
        for source in self.context_sources:
            extra = await source(tool_ctx)
            if extra:
                parts.append(extra)
        return "\n\n".join(parts)
