"""`choose_boundary` over random histories (hypothesis): always legal, and the newest legal one."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.memory.consolidation import choose_boundary
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.window import trim_to_legal_window


@st.composite
def histories(draw: st.DrawFn) -> list[ChatMessage]:
    """Runs as the agent writes them: user, tool groups, answers; some cut short by a crash,
    some repaired, some with a user message injected at a tool boundary (steer)."""
    out: list[ChatMessage] = []
    n_call = 0
    for _ in range(draw(st.integers(1, 12))):
        out.append(ChatMessage(role="user", content="u"))
        for _ in range(draw(st.integers(0, 3))):
            ids = [f"c{n_call + i}" for i in range(draw(st.integers(1, 3)))]
            n_call += len(ids)
            out.append(ChatMessage(role="assistant", tool_calls=tuple(tool_call(i, "t", {}) for i in ids)))
            answered = draw(st.sampled_from(["all", "all", "all", "some", "none"]))
            order = draw(st.permutations(ids))
            done = order if answered == "all" else order[: draw(st.integers(0, len(ids) - 1))]
            out += [ChatMessage(role="tool", content="r", tool_call_id=i) for i in done]
            if answered != "all":
                if draw(st.booleans()):  # resumed: the missing results appended as repairs
                    out += [
                        ChatMessage(role="tool", content="x", tool_call_id=i) for i in ids if i not in done
                    ]
                else:
                    break  # crashed; the next event starts a new turn
            if draw(st.integers(0, 5)) == 0:
                out.append(ChatMessage(role="user", content="steer"))
        else:
            if draw(st.booleans()):
                out.append(ChatMessage(role="assistant", content="a"))
    return [ChatMessage(**{**m.__dict__, "seq": i + 1}) for i, m in enumerate(out)]


def legal(history: list[ChatMessage], b: int) -> bool:
    """Written independently of the code under test: boundary after seq `b`."""
    rest = history[b:]
    if not rest or rest[0].role != "user":
        return False
    for j, msg in enumerate(history):
        if msg.role != "tool" or j < b:
            continue
        issuer = max(
            (i for i in range(j) if msg.tool_call_id in history[i].tool_call_ids),
            default=None,
        )
        if issuer is not None and issuer < b:
            return False
    return True


@settings(max_examples=400, deadline=None)
@given(history=histories(), keep=st.integers(1, 8))
def test_boundary_is_legal_and_newest(history: list[ChatMessage], keep: int) -> None:
    b = choose_boundary(history, keep=keep)
    candidates = [c for c in range(1, len(history)) if len(history) - c >= keep and legal(history, c)]
    if b is None:
        assert candidates == []
        return
    assert legal(history, b)
    assert len(history) - b >= keep
    assert b == max(candidates)
    # Any model window that lies after the boundary is the same before and after.
    for limit in range(1, 12):
        window = trim_to_legal_window(history, max_messages=limit)
        if window and window[0].seq is not None and window[0].seq > b:
            assert trim_to_legal_window(history[b:], max_messages=limit) == window


def test_never_inside_a_tool_call_group() -> None:
    h = [
        ChatMessage(role="user", content="u", seq=1),
        ChatMessage(role="assistant", tool_calls=(tool_call("a", "t", {}),), seq=2),
        ChatMessage(role="user", content="steer", seq=3),  # injected at a tool boundary
        ChatMessage(role="tool", content="r", tool_call_id="a", seq=4),
        ChatMessage(role="assistant", content="done", seq=5),
        ChatMessage(role="user", content="next", seq=6),
    ]
    assert choose_boundary(h, keep=1) == 5
    assert choose_boundary(h, keep=2) is None  # seq 2 would split the group (its result is at 4)
