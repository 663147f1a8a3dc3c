"""How many tokens a request costs, and how many the model takes.

A real tokenizer where one fits the model and can be loaded offline: `tiktoken`, when it
is installed and its encoding files are at hand (it downloads them at first use, so a
machine without that access needs `TIKTOKEN_CACHE_DIR` pointing at a copy). Otherwise a
documented, deliberately high estimate: a token per three UTF-8 bytes (English text runs
at about four characters a token; a CJK character is three bytes and about one token),
plus a few tokens of framing per message. The estimate errs on the safe side, so a window
it admits fits the model's context.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from app.sessions.messages import ChatMessage

log = structlog.get_logger(__name__)

MESSAGE_FRAMING = 4  # role and separators of one message
TextCounter = Callable[[str], int]


def estimate_text(text: str) -> int:
    """The safe estimate: a token per three UTF-8 bytes, rounded up."""
    return -(-len(text.encode("utf-8")) // 3)


@functools.lru_cache(maxsize=16)
def text_counter(model: str | None) -> tuple[TextCounter, str]:
    """The counter for `model` and its name: tiktoken's encoding, else the estimate."""
    try:
        import tiktoken  # optional: not a dependency, its files are not offline

        try:
            encoding = tiktoken.encoding_for_model(model or "")
        except KeyError:
            encoding = tiktoken.get_encoding("o200k_base")
        encoding.encode("probe")
    except Exception as exc:  # not installed, or its encoding files cannot be read
        log.info("tokenizer_estimate", model=model, reason=type(exc).__name__)
        return estimate_text, "estimate"
    return (lambda text: len(encoding.encode(text, disallowed_special=()))), f"tiktoken:{encoding.name}"


def count_message(message: ChatMessage, count: TextCounter) -> int:
    size = MESSAGE_FRAMING + count(message.content or "")
    for call in message.tool_calls or ():
        size += count(json.dumps(call, ensure_ascii=False))
    return size


def count_request(
    messages: Sequence[ChatMessage], tools: Sequence[Mapping[str, Any]], count: TextCounter
) -> int:
    """The prompt of a chat-completions request: its messages and its tool specs."""
    specs = count(json.dumps(list(tools), ensure_ascii=False)) if tools else 0
    return sum(count_message(m, count) for m in messages) + specs


@dataclass(frozen=True)
class ContextLimits:
    """Each model's context in tokens (`LLM_CONTEXT_TOKENS`, per model and per agent), and
    what a request leaves free for the answer (`LLM_REPLY_TOKENS`)."""

    default: int = 128_000
    by_model: Mapping[str, int] = field(default_factory=dict)
    reply: int = 4096

    def context(self, model: str | None, agent: Mapping[str, int] | None = None) -> int:
        """The agent's entry for the model, else the service's, else the default."""
        for table in (agent or {}, self.by_model):
            if model is not None and model in table:
                return int(table[model])
        return self.default

    def budget(self, model: str | None, agent: Mapping[str, int] | None = None) -> int:
        """The most a request's prompt may cost."""
        return max(0, self.context(model, agent) - self.reply)
