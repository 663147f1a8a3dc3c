"""Splitting replies for Telegram: within the limit in UTF-16 units, nothing lost or reordered."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from channels.telegram.text import split_text, utf16_len

_text = st.text(alphabet=st.sampled_from(["a", "b", "ж", "字", "😀", " ", "\n"]), max_size=600)


@given(_text, st.integers(min_value=16, max_value=120))
def test_chunks_fit_and_keep_every_visible_character_in_order(text: str, limit: int) -> None:
    chunks = split_text(text, limit)
    assert all(0 < utf16_len(c) <= limit for c in chunks)
    assert all(c.strip() for c in chunks)
    assert re.sub(r"\s", "", "".join(chunks)) == re.sub(r"\s", "", text)


def test_breaks_prefer_paragraphs_then_lines_then_words() -> None:
    para = "x" * 30
    assert split_text(f"{para}\n\n{para}", 40) == [f"{para}\n\n", para]
    assert split_text(f"{para}\n{para}", 40) == [f"{para}\n", para]
    assert split_text("word " * 10, 22) == ["word word word word ", "word word word word ", "word word "]


def test_emoji_count_twice() -> None:
    assert utf16_len("😀") == 2
    assert split_text("😀" * 10, 16) == ["😀" * 8, "😀" * 2]
