"""The model provider seam."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from app.errors import ProviderError
from app.sessions.messages import ChatMessage

DeltaCallback = Callable[[str], Awaitable[None]]
"""Receives each piece of streamed answer text as the model produces it."""


class PartialReplyError(ProviderError):
    """The provider failed after part of the answer was already streamed (not retried)."""


@dataclass(frozen=True)
class ToolSpec:
    """What the model is told about a tool (OpenAI function-tool shape)."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_provider(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0  # of the prompt tokens, those the provider read from its cache


@dataclass(frozen=True)
class ProviderReply:
    content: str | None
    tool_calls: tuple[dict[str, Any], ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str | None = None
    # Images of the answer itself (event part dicts with their bytes or URL), if any.
    parts: tuple[dict[str, Any], ...] = ()


class ChatProvider(Protocol):
    name: str

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
    ) -> ProviderReply:
        """One model call. `messages` is a legal provider input (system first).

        Raises `ProviderError` once the provider gave up.
        """
        ...

    async def aclose(self) -> None: ...


class StreamingChatProvider(ChatProvider, Protocol):
    """A provider that can hand out the answer text while it is being produced."""

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ProviderReply:
        """As `ChatProvider.complete`; `on_delta` receives each piece of text."""
        ...
