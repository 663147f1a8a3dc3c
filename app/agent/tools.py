"""Tools the model may call: the protocol, a registry and built-in tools."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import structlog

from app.access.roles import Role
from app.agent.policy import ALLOW_ALL, ToolPolicy
from app.agent.provider import ToolSpec
from app.agent.trust import Trust
from app.db.models import utcnow

log = structlog.get_logger(__name__)


class Risk(StrEnum):
    SAFE = "safe"  # runs when asked
    # Runs when asked in a clean turn; needs an approval once content nobody trusts (a tool
    # result, a file, another member's message) is in the turn (`app.agent.trust`).
    GUARDED = "guarded"
    RISKY = "risky"  # always needs an approval


@dataclass
class ToolContext:
    """What a tool may know about the turn it runs in."""

    session_id: int
    session_key: str
    channel: str
    chat_id: str
    sender_id: str
    thread_id: str | None
    message_count: Callable[[], Awaitable[int]]
    extras: dict[str, Any] = field(default_factory=dict)
    policy: ToolPolicy = ALLOW_ALL
    chat_type: str = "direct"
    generation: int = 0  # the session's generation (per-session workspaces)
    trust: Trust = field(default_factory=Trust)  # whom the run serves, what it has read


@dataclass(frozen=True)
class ToolOutput:
    """A tool's result for the model (`text`) with media for the turn's answer.

    `attachments` are image or file parts (`app.events` part dicts with their bytes);
    the run attaches them to its final answer (`app.agent.send_file`).
    """

    text: str
    attachments: tuple[dict[str, Any], ...] = ()


class Tool(Protocol):
    """A tool. It may also declare `role`, the least role (`app.access.roles`) of the
    person a run serves for a call to run: default `member` (guests run no tools)."""

    spec: ToolSpec
    risk: Risk

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str | ToolOutput: ...


class ToolError(Exception):
    """A tool failed in a way the model should be told about."""


SPECS_KEPT = 256  # policies whose tool lists a registry keeps


class ToolRegistry:
    def __init__(self, tools: Iterable[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        # What each policy allows, asked once per model call: a few policies, a fixed set
        # of tools (a registration clears it).
        self._specs: dict[ToolPolicy, tuple[ToolSpec, ...]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        if tool.spec.name in self._tools:
            raise ValueError(f"tool {tool.spec.name!r} is registered twice")
        self._tools[tool.spec.name] = tool
        self._specs.clear()

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def specs(self, policy: ToolPolicy = ALLOW_ALL) -> list[ToolSpec]:
        """What the model is offered: the tools `policy` allows."""
        specs = self._specs.get(policy)
        if specs is None:
            specs = tuple(t.spec for t in self._tools.values() if policy.allows(t.spec.name))
            if len(self._specs) < SPECS_KEPT:
                self._specs[policy] = specs
        return list(specs)

    def risk(self, name: str) -> Risk | None:
        tool = self._tools.get(name)
        return tool.risk if tool is not None else None

    def role(self, name: str) -> Role:
        """The role a tool declares it needs (`role`), `member` when it declares none."""
        return Role.parse(getattr(self._tools.get(name), "role", None)) or Role.MEMBER

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    async def execute(self, call: dict[str, Any], ctx: ToolContext) -> str:
        """Run one tool call, its result as text (attachments dropped: `run_call` keeps them)."""
        output = await self.run_call(call, ctx)
        return output if isinstance(output, str) else output.text

    async def run_call(self, call: dict[str, Any], ctx: ToolContext) -> str | ToolOutput:
        """Run one tool call; every failure becomes a result the model can read."""
        fn = call.get("function", {})
        name = fn.get("name", "")
        tool = self._tools.get(name)
        if tool is None:
            return json.dumps({"error": f"unknown tool {name!r}"})
        try:
            raw = fn.get("arguments") or "{}"
            arguments = json.loads(raw) if isinstance(raw, str) else dict(raw)
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return json.dumps({"error": f"invalid arguments: {exc}"})
        try:
            return await tool.run(arguments, ctx)
        except ToolError as exc:
            return json.dumps({"error": str(exc)})
        except Exception as exc:  # a tool's bug must not kill the turn: the model is told
            log.exception("tool_failed", tool=name)
            return json.dumps({"error": f"tool {name!r} failed: {type(exc).__name__}"})


class CurrentTimeTool:
    spec = ToolSpec(
        name="current_time",
        description="The current date and time, optionally in an IANA time zone.",
        parameters={
            "type": "object",
            "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Berlin; default UTC"}},
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, clock: Callable[[], datetime] = utcnow) -> None:
        self.clock = clock

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        tz_name = arguments.get("timezone") or "UTC"
        try:
            tz = ZoneInfo(tz_name)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ToolError(f"unknown time zone {tz_name!r}") from exc
        now = self.clock().astimezone(tz)
        return json.dumps(
            {"iso": now.isoformat(timespec="seconds"), "timezone": tz_name, "weekday": now.strftime("%A")}
        )


class SessionInfoTool:
    spec = ToolSpec(
        name="session_info",
        description="Facts about this conversation: its key, channel and message count.",
        parameters={"type": "object", "properties": {}, "additionalProperties": False},
    )
    risk = Risk.SAFE

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        return json.dumps(
            {
                "session_key": ctx.session_key,
                "channel": ctx.channel,
                "message_count": await ctx.message_count(),
            }
        )


def builtin_tools() -> list[Tool]:
    return [CurrentTimeTool(), SessionInfoTool()]
