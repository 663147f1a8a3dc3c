"""Splitting replies for Slack: within the limit, nothing lost or reordered."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from channels.slack.text import split_text

_text = st.text(alphabet=st.sampled_from(["a", "b", "é", "字", "😀", " ", "\n"]), max_size=1000)


@given(_text, st.integers(min_value=100, max_value=300))
def test_chunks_fit_and_keep_every_visible_character_in_order(text: str, limit: int) -> None:
    chunks = split_text(text, limit)
    assert all(0 < len(c) <= limit for c in chunks)
    assert all(c.strip() for c in chunks)
    assert re.sub(r"\s", "", "".join(chunks)) == re.sub(r"\s", "", text)


def test_breaks_prefer_lines_then_words() -> None:
    line = "y" * 80
    assert split_text(f"{line}\n{line}", 100) == [f"{line}\n", line]
    assert split_text("w " * 120, 100) == ["w " * 50, "w " * 50, "w " * 20]
