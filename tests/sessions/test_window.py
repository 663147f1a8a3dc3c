"""The safe history window, checked against an independent definition of legality."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.sessions.messages import ChatMessage, estimate_tokens, tool_call
from app.sessions.window import is_legal_provider_input, trim_to_legal_window


def _user(i: int) -> ChatMessage:
    return ChatMessage(role="user", content=f"u{i}")


def _legal(window: list[ChatMessage]) -> bool:
    """Written separately from the implementation: what a provider accepts."""
    if not window:
        return True
    if window[0].role != "user":
        return False
    i = 0
    while i < len(window):
        msg = window[i]
        if msg.role == "tool":
            return False  # a result not directly after its call
        if msg.role == "assistant" and msg.tool_calls:
            ids = [tc["id"] for tc in msg.tool_calls]
            results = window[i + 1 : i + 1 + len(ids)]
            if sorted(r.tool_call_id or "" for r in results if r.role == "tool") != sorted(ids):
                return False
            if any(r.role != "tool" for r in results):
                return False
            i += 1 + len(ids)
            continue
        i += 1
    return True


@st.composite
def histories(draw: st.DrawFn) -> list[ChatMessage]:
    """Legal turns, then possibly a turn cut anywhere (a crash), then more turns."""
    out: list[ChatMessage] = []
    counter = 0
    for _turn in range(draw(st.integers(0, 8))):
        counter += 1
        turn: list[ChatMessage] = [_user(counter)]
        for _round in range(draw(st.integers(0, 3))):
            n = draw(st.integers(1, 3))
            ids = [f"c{counter}_{_round}_{k}" for k in range(n)]
            turn.append(ChatMessage(role="assistant", tool_calls=tuple(tool_call(i, "t", {}) for i in ids)))
            turn += [
                ChatMessage(role="tool", content="r" * draw(st.integers(0, 40)), tool_call_id=i) for i in ids
            ]
        turn.append(ChatMessage(role="assistant", content="a" * draw(st.integers(0, 40))))
        if draw(st.booleans()) and draw(st.integers(0, 4)) == 0:
            turn = turn[: draw(st.integers(1, len(turn)))]  # crashed mid-turn
        out += turn
    if draw(st.booleans()):
        start = draw(st.integers(0, len(out)))  # last_consolidated anywhere: may cut a group
        out = out[start:]
    return out


@settings(max_examples=400)
@given(histories(), st.none() | st.integers(1, 30), st.none() | st.integers(5, 400))
def test_window_is_the_longest_legal_suffix_within_limits(history, max_messages, max_tokens) -> None:
    window = trim_to_legal_window(history, max_messages=max_messages, max_tokens=max_tokens)
    assert _legal(window)
    assert is_legal_provider_input(window)
    if max_messages is not None:
        assert len(window) <= max_messages
    if max_tokens is not None:
        assert sum(estimate_tokens(m) for m in window) <= max_tokens
    # It is a suffix of the history minus an unfinished trailing group …
    if window:
        n = len(window)
        ends = [i for i in range(n, len(history) + 1) if history[i - n : i] == window]
        assert ends, "window is not a contiguous part of the history"
        end = ends[-1]
        assert all(m.role == "tool" or (m.role == "assistant" and m.tool_calls) for m in history[end:])
    # … and no longer legal suffix ending there fits the limits.
    end = len(history)
    while end > 0 and (history[end - 1].role == "tool" or history[end - 1].tool_calls):
        if _legal_end(history, end):
            break
        end -= 1
    for start in range(0, end):
        candidate = history[start:end]
        if len(candidate) <= len(window):
            break
        fits = (max_messages is None or len(candidate) <= max_messages) and (
            max_tokens is None or sum(estimate_tokens(m) for m in candidate) <= max_tokens
        )
        assert not (fits and _legal(candidate)), "a longer legal window exists"


def _legal_end(history: list[ChatMessage], end: int) -> bool:
    """True if history[:end] does not end inside an unfinished tool-call group."""
    for i in range(end - 1, -1, -1):
        if history[i].role == "assistant" and history[i].tool_calls:
            ids = set(history[i].tool_call_ids)
            got = {m.tool_call_id for m in history[i + 1 : end]}
            return ids <= got
        if history[i].role != "tool":
            return True
    return True


def test_examples_from_the_design() -> None:
    call = ChatMessage(role="assistant", tool_calls=(tool_call("x", "t", {}),))
    result = ChatMessage(role="tool", content="r", tool_call_id="x")
    answer = ChatMessage(role="assistant", content="a")
    # 1. leading orphan tool results are dropped; 2. start at a user message
    assert trim_to_legal_window([result, answer, _user(1), answer]) == [_user(1), answer]
    # 3. a trailing call without its result is dropped
    assert trim_to_legal_window([_user(1), call]) == [_user(1)]
    # 4. limits never split a group: 3 messages would start at the call → next user
    assert trim_to_legal_window([_user(1), call, result, answer, _user(2)], max_messages=4) == [_user(2)]
    assert trim_to_legal_window([_user(1), call, result, answer], max_messages=4) == [
        _user(1),
        call,
        result,
        answer,
    ]
