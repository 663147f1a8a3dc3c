"""The run loop: model call, tool calls, model call … until a final answer.

Every message the loop produces is handed to `RunHooks.append` as soon as it exists,
and the final answer to `RunHooks.finish`, which commits it together with the reply and
the event status. A crash at any point therefore leaves a history that is legal after
`repair_interrupted` and a turn that can be resumed.

Between tool-call groups the loop asks `RunHooks.at_boundary` for new input: messages
of the same session (the `steer` busy policy) are appended there, after the complete
tool-result group, and a `/stop` ends the run. While the model or a tool is working the
loop also races `RunHooks.wait_stop`, so `/stop` does not wait for a slow model call.

Every call is checked against the role of the person the run serves (`ToolContext.trust`,
`app.agent.trust`): a tool that needs more is refused with an error the model can explain,
and nothing runs. A risky tool call, and a guarded one once content nobody trusts is in
the turn (a tool result, a file, another member's message), asks `RunHooks.gate` first.
The gate may allow it, deny it (no human could approve it here), or answer `ask`: then
`RunHooks.pause` stores a pending approval and finishes the turn with the question, and the
run continues later through `AgentRunner.resume` when `/approve` or `/deny` (or the timeout) arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import structlog

from app import tracing
from app.agent.provider import ChatProvider, DeltaCallback, ProviderReply, StreamingChatProvider, ToolSpec
from app.agent.send_file import answer_parts, keep
from app.agent.tools import Risk, ToolContext, ToolRegistry
from app.agent.trust import labelled
from app.errors import LeaseLost, ProviderError
from app.sessions.messages import ChatMessage
from app.sessions.window import is_legal_provider_input, trim_to_legal_window

log = structlog.get_logger(__name__)

T = TypeVar("T")
A = TypeVar("A")
B = TypeVar("B")

ContextSource = Callable[[ToolContext], Awaitable[str | None]]
"""Adds text to the system message of a run (recalled memory, operator facts …)."""

INTERRUPTED_RESULT = json.dumps({"error": "interrupted: the run stopped before this tool finished"})
TRUNCATION_MARKER = "\n[… truncated by chatgate: {dropped} more characters]"
STOPPED_TEXT = "Stopped."
PROVIDER_DOWN_TEXT = "Sorry, the model is not reachable right now. Please try again later."


def denied_result(reason: str) -> str:
    return json.dumps({"error": f"denied: {reason}"})


def role_refusal(name: str, needed: Any, role: Any) -> str:
    """The error a call gets when the person served may not use the tool (nothing ran)."""
    return (
        f"tool {name!r} needs the {needed.label} role in this chat; the person who asked is "
        f"{'an' if role.label[0] in 'aeiou' else 'a'} {role.label} here, so nothing was run. "
        f"Tell them that someone with the {needed.label} role has to ask for it."
    )


def truncate_tool_result(text: str, limit: int) -> str:
    if len(text) <= limit or text.startswith(TRUNCATION_MARKER[:26], limit):  # not twice
        return text
    return text[:limit] + TRUNCATION_MARKER.format(dropped=len(text) - limit)


@dataclass(frozen=True)
class Decision:
    """What the approval gate says about one risky call."""

    verdict: str  # "allow" | "deny" | "ask"
    by: str | None = None
    reason: str | None = None


@dataclass(frozen=True)
class StopRequest:
    """A `/stop` seen while the run was going on (an inbox row of the same key)."""

    row_id: int
    event_id: str
    sender_id: str


class RunStopped(Exception):
    def __init__(self, request: StopRequest) -> None:
        super().__init__(f"stopped by {request.sender_id}")
        self.request = request


# (system message, window, tool specs) -> the window to send, within the model's context.
FitWindow = Callable[[ChatMessage, list[ChatMessage], Sequence[ToolSpec]], Awaitable[list[ChatMessage]]]


@dataclass
class RunHooks:
    load_window: Callable[[], Awaitable[list[ChatMessage]]]
    append: Callable[[list[ChatMessage]], Awaitable[None]]
    finish: Callable[[ChatMessage, RunRecord], Awaitable[None]]
    on_delta: DeltaCallback | None = None
    at_boundary: Callable[[], Awaitable[StopRequest | None]] | None = None
    wait_stop: Callable[[], Awaitable[StopRequest]] | None = None
    stopped: Callable[[ChatMessage, RunRecord, StopRequest], Awaitable[None]] | None = None
    gate: Callable[[dict[str, Any], ToolContext], Awaitable[Decision]] | None = None
    pause: Callable[[dict[str, Any], RunRecord], Awaitable[None]] | None = None
    # The window that fits the model's context with the system text and tool specs.
    fit: FitWindow | None = None
    # Before each model call (a budget may refuse it: `BudgetReached`), and after it with
    # the reply and its usage (app.usage records what it cost).
    before_model: Callable[[str | None], Awaitable[None]] | None = None
    after_model: Callable[[ProviderReply, str | None], Awaitable[None]] | None = None


class BudgetReached(Exception):
    """A usage budget is spent: the model is not called; `user_text` tells the sender."""

    def __init__(self, user_text: str) -> None:
        super().__init__(user_text)
        self.user_text = user_text


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
    model_ms: int = 0
    tool_ms: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    # Attachments of this run with their bytes (`app.agent.send_file`), in this process only.
    media: list[dict[str, Any]] = field(default_factory=list)

    def add_usage(self, reply: ProviderReply, ms: int) -> None:
        self.iterations += 1
        self.prompt_tokens += reply.usage.prompt_tokens
        self.completion_tokens += reply.usage.completion_tokens
        self.model_ms += ms
        if reply.model:
            self.model = reply.model

    def trace_details(self) -> dict[str, Any]:
        return {**self.details, "model_ms": self.model_ms, "tool_ms": self.tool_ms}


def repair_interrupted(tail: Sequence[ChatMessage], result: str = INTERRUPTED_RESULT) -> list[ChatMessage]:
    """Tool results to append for calls a crashed run left unanswered (append-only repair)."""
    pending = open_calls(tail)
    return [
        ChatMessage(role="tool", content=result, tool_call_id=call["id"], name=_call_name(call))
        for call in pending
    ]


def open_calls(tail: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The calls of the newest tool-call group that have no result yet (in call order)."""
    calls: list[dict[str, Any]] = []
    answered: set[str] = set()
    for msg in tail:
        if msg.role == "assistant" and msg.tool_calls:
            calls, answered = list(msg.tool_calls), set()
        elif msg.role == "tool":
            answered.add(msg.tool_call_id or "")
        else:
            calls, answered = [], set()
    return [c for c in calls if c["id"] not in answered]


def _call_name(call: Mapping[str, Any]) -> str:
    return str(call.get("function", {}).get("name", ""))


def _accepts_on_delta(provider: ChatProvider) -> bool:
    try:
        params = inspect.signature(provider.complete).parameters
    except (TypeError, ValueError):
        return False
    return "on_delta" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


class _Paused(Exception):
    """The run waits for a human's decision; the turn is already finished."""


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
        self._streams = _accepts_on_delta(provider)

    async def run(self, hooks: RunHooks, tool_ctx: ToolContext, *, model: str | None = None) -> RunRecord:
        record = RunRecord(provider=self.provider.name, model=model)
        return await self._drive(hooks, tool_ctx, record, model=model, calls=(), decisions={})

    async def resume(
        self,
        hooks: RunHooks,
        tool_ctx: ToolContext,
        record: RunRecord,
        *,
        calls: Sequence[dict[str, Any]],
        decisions: Mapping[str, Decision],
        model: str | None = None,
    ) -> RunRecord:
        """Continue a paused run: run the group's remaining `calls`, then the loop."""
        return await self._drive(hooks, tool_ctx, record, model=model, calls=calls, decisions=decisions)

    async def _drive(
        self,
        hooks: RunHooks,
        tool_ctx: ToolContext,
        record: RunRecord,
        *,
        model: str | None,
        calls: Sequence[dict[str, Any]],
        decisions: Mapping[str, Decision],
    ) -> RunRecord:
        pending: list[dict[str, Any]] = list(calls)
        try:
            if pending:
                await self._run_calls(hooks, tool_ctx, record, pending, decisions)
                await self._boundary(hooks)
            # The first window is read while the context sources (memory recall) are: two
            # reads on two pooled connections, one round trip of waiting.
            text, first = await _both(self._system_text(tool_ctx), hooks.load_window())
            system = ChatMessage(role="system", content=text)
            history: list[ChatMessage] | None = first
            while record.iterations < self.max_iterations:
                if history is None:
                    history = await hooks.load_window()
                window, history = self._prepare(history), None
                specs = self.tools.specs(tool_ctx.policy)
                if hooks.fit is not None:
                    window = self._prepare(await hooks.fit(system, window, specs))
                if hooks.before_model is not None:
                    await hooks.before_model(model)
                started = time.monotonic()
                with tracing.model_call(self.provider, model) as span:
                    reply = await self._guard(
                        hooks,
                        self._complete(
                            labelled(system, window, tool_ctx.trust),
                            specs,
                            model=model,
                            on_delta=hooks.on_delta,
                        ),
                    )
                    tracing.model_answered(span, reply)
                record.add_usage(reply, round((time.monotonic() - started) * 1000))
                if hooks.after_model is not None:
                    await hooks.after_model(reply, model)
                if not reply.tool_calls:
                    record.outcome = "ok"
                    final = await self._answer(reply.content or "", record, tool_ctx, reply.parts)
                    await hooks.finish(final, record)
                    return record
                pending = list(reply.tool_calls)
                await hooks.append(
                    [ChatMessage(role="assistant", content=reply.content, tool_calls=reply.tool_calls)]
                )
                await self._run_calls(hooks, tool_ctx, record, pending, {})
                await self._boundary(hooks)
            record.outcome = "max_iterations"
            text = f"I stopped after {self.max_iterations} steps without a final answer."
        except _Paused:
            return record
        except LeaseLost:
            raise
        except RunStopped as stop:
            record.outcome = "stopped"
            record.details["stopped_by"] = stop.request.sender_id
            if pending:
                await hooks.append(
                    repair_interrupted([ChatMessage(role="assistant", tool_calls=tuple(pending))])
                )
                for call in pending:
                    record.tool_calls.append(
                        {"id": call["id"], "name": _call_name(call), "ms": 0, "decision": "interrupted"}
                    )
            final = await self._answer(STOPPED_TEXT, record, tool_ctx)
            if hooks.stopped is not None:
                await hooks.stopped(final, record, stop.request)
            else:
                await hooks.finish(final, record)
            return record
        except BudgetReached as exc:
            record.outcome = "budget"
            text = exc.user_text
        except ProviderError as exc:
            log.warning("provider_failed", error=exc.detail, status=exc.status)
            record.outcome, record.error = "provider_error", exc.detail
            text = getattr(exc, "user_text", None) or PROVIDER_DOWN_TEXT  # e.g. a context overflow
        await hooks.finish(await self._answer(text, record, tool_ctx), record)
        return record

    async def _answer(
        self, text: str, record: RunRecord, tool_ctx: ToolContext, images: Sequence[dict[str, Any]] = ()
    ) -> ChatMessage:
        """The final answer, with what the run attached (`send_file`) and the model's images."""
        parts = (*(await answer_parts(record.details, record.media, self.tools, tool_ctx) or ()), *images)
        return ChatMessage(role="assistant", content=text, parts=parts or None)

    async def _complete(
        self,
        messages: list[ChatMessage],
        specs: Sequence[ToolSpec],
        *,
        model: str | None,
        on_delta: DeltaCallback | None,
    ) -> ProviderReply:
        if self._streams and on_delta is not None:
            streaming = cast(StreamingChatProvider, self.provider)
            return await streaming.complete(messages, specs, model=model, on_delta=on_delta)
        return await self.provider.complete(messages, specs, model=model)

    def _prepare(self, window: list[ChatMessage]) -> list[ChatMessage]:
        """The last line of defence before a request: legal structure, bounded tool results."""
        if not is_legal_provider_input(window):
            # The window code guarantees this; if it ever fails, send less rather than a
            # request every provider rejects.
            log.error("illegal_window_repaired", size=len(window))
            window = trim_to_legal_window(window)
        limit = self.max_tool_result_chars
        return [
            ChatMessage(
                role=m.role,
                content=truncate_tool_result(m.content, limit),
                tool_call_id=m.tool_call_id,
                name=m.name,
                seq=m.seq,
            )
            if m.role == "tool" and m.content and len(m.content) > limit
            else m
            for m in window
        ]

    async def _run_calls(
        self,
        hooks: RunHooks,
        tool_ctx: ToolContext,
        record: RunRecord,
        pending: list[dict[str, Any]],
        decisions: Mapping[str, Decision],
    ) -> None:
        """Answer each call of one group in order; `pending` shrinks as results are appended."""
        while pending:
            call = pending[0]
            name = _call_name(call)
            entry: dict[str, Any] = {"id": call["id"], "name": name, "ms": 0}
            result: str | None = None
            risk = self.tools.risk(name)
            if name not in self.tools:
                entry["decision"] = "unknown_tool"
            elif not tool_ctx.policy.allows(name):
                entry["decision"] = "refused:policy"
                result = json.dumps({"error": f"tool {name!r} is not allowed here"})
            elif (needed := tool_ctx.trust.needed(name, self.tools.role(name))) > (
                role := await tool_ctx.trust.least_role()
            ):
                entry["decision"] = "refused:role"
                result = json.dumps({"error": role_refusal(name, needed, role)})
            elif risk is Risk.RISKY or (risk is Risk.GUARDED and tool_ctx.trust.untrusted):
                decision = decisions.get(call["id"])
                if decision is None:
                    decision = (
                        await hooks.gate(call, tool_ctx)
                        if hooks.gate is not None
                        else Decision("deny", by="policy", reason="no approval gate")
                    )
                if decision.verdict == "ask" and hooks.pause is not None:
                    await hooks.pause(call, record)
                    raise _Paused
                if decision.verdict == "allow":
                    entry["decision"] = "approved"
                else:
                    entry["decision"] = "denied"
                    result = denied_result(decision.reason or "not approved")
                if decision.by:
                    entry["decided_by"] = decision.by
            else:
                entry["decision"] = "auto"
            if result is None:
                started = time.monotonic()
                with tracing.tool_call(name, call["id"]):
                    output = await self._guard(hooks, self.tools.run_call(call, tool_ctx))
                result = keep(output, record.details, record.media)
                entry["ms"] = round((time.monotonic() - started) * 1000)
                record.tool_ms += entry["ms"]
            result = truncate_tool_result(result, self.max_tool_result_chars)
            if entry["decision"] in ("auto", "approved"):
                tool_ctx.trust.untrusted = True  # what a tool returned is nobody's word
            record.tool_calls.append(entry)
            await hooks.append([ChatMessage(role="tool", content=result, tool_call_id=call["id"], name=name)])
            pending.pop(0)

    async def _boundary(self, hooks: RunHooks) -> None:
        if hooks.at_boundary is None:
            return
        stop = await hooks.at_boundary()
        if stop is not None:
            raise RunStopped(stop)

    async def _guard(self, hooks: RunHooks, work: Coroutine[Any, Any, T]) -> T:
        """Await `work`, but give up on it as soon as a `/stop` for this session arrives."""
        if hooks.wait_stop is None:
            return await work
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(hooks.wait_stop())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            task.cancel()
            watcher.cancel()
            raise
        if task.done():
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise RunStopped(watcher.result())

    async def _system_text(self, tool_ctx: ToolContext) -> str:
        parts = [self.system_prompt]
        for source in self.context_sources:
            extra = await source(tool_ctx)
            if extra:
                parts.append(extra)
        return "\n\n".join(parts)


async def _both(first: Awaitable[A], second: Awaitable[B]) -> tuple[A, B]:
    """Await two reads concurrently; if either failed, raise its error once both ended."""
    one, two = await asyncio.gather(first, second, return_exceptions=True)
    for result in (one, two):
        if isinstance(result, BaseException):
            raise result
    return cast(A, one), cast(B, two)
