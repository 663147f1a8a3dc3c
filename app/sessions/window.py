"""The safe history window: the longest legal suffix of a history within the limits.

A provider rejects a request with a tool result whose call is not in it, or with a tool
call whose results are missing. `trim_to_legal_window` is the only place that decides
what part of a history the model sees, so those rules live here once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.sessions.messages import ChatMessage, estimate_tokens


def _structure(messages: Sequence[ChatMessage]) -> tuple[int, int]:
    """Return (min_start, end).

    `end` excludes a trailing tool-call group whose results are incomplete (an
    interrupted run). `min_start` lies after every broken structure inside
    `messages[:end]` (an orphan tool result, or a group whose results stop early), so
    no window may start before it.
    """
    min_start = 0
    pending: set[str] = set()
    group_start = -1
    for idx, msg in enumerate(messages):
        if msg.role == "tool":
            if msg.tool_call_id in pending:
                pending.discard(msg.tool_call_id)
            else:
                min_start = idx + 1  # orphan, or a result after its group closed
            continue
        if pending:  # the previous group stopped before all its results arrived
            min_start = idx
            pending = set()
        if msg.role == "assistant" and msg.tool_calls:
            pending = set(msg.tool_call_ids)
            group_start = idx
    if pending:
        return min_start, group_start
    return min_start, len(messages)


def trim_to_legal_window(
    messages: Sequence[ChatMessage],
    *,
    max_messages: int | None = None,
    max_tokens: int | None = None,
    count_tokens: Callable[[ChatMessage], int] = estimate_tokens,
) -> list[ChatMessage]:
    """Cut `messages` (oldest first) to the longest legal suffix within the limits.

    Legal: starts with a user message, no tool result without its call in the window,
    no tool call without all its results, groups never split. The result may be empty
    when no user message fits.
    """
    min_start, end = _structure(messages)
    lo = min_start
    if max_messages is not None:
        lo = max(lo, end - max_messages)
    if max_tokens is not None:
        total = 0
        start = end
        while start > lo:
            cost = count_tokens(messages[start - 1])
            if total + cost > max_tokens:
                break
            total += cost
            start -= 1
        lo = start
    for idx in range(lo, end):
        if messages[idx].role == "user":
            return list(messages[idx:end])
    return []


def is_legal_provider_input(messages: Sequence[ChatMessage]) -> bool:
    """True when `messages` is a history a chat-completions provider accepts."""
    if not messages:
        return True
    if messages[0].role != "user":
        return False
    min_start, end = _structure(messages)
    return min_start == 0 and end == len(messages)
