"""The message shape shared by history, window and agent (OpenAI chat format)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChatMessage:
    role: str  # "user" | "assistant" | "tool" | "system"
    content: str | None = None
    tool_calls: tuple[dict[str, Any], ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    parts: tuple[dict[str, Any], ...] | None = None
    event_id: str | None = None
    seq: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def tool_call_ids(self) -> list[str]:
        return [tc["id"] for tc in self.tool_calls or ()]

    def to_provider(self) -> dict[str, Any]:
        """The dict a chat-completions API takes."""
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [dict(tc) for tc in self.tool_calls]
        if self.role == "tool":
            out["tool_call_id"] = self.tool_call_id
        if self.name and self.role != "tool":
            out["name"] = self.name
        return out


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, sort_keys=True)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def estimate_tokens(message: ChatMessage) -> int:
    """A cheap, monotone estimate (about four characters a token)."""
    size = len(message.content or "")
    for tc in message.tool_calls or ():
        size += len(json.dumps(tc))
    return 4 + size // 4
