"""The log follows `sys.stderr` as it is at each line, not as it was when logging was set up."""

from __future__ import annotations

import contextlib
import io
import json

import structlog

from app.logs import configure_logging


def test_a_line_goes_to_the_stream_in_place_now_even_after_the_first_one_closed() -> None:
    first, second = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(first):
        configure_logging("INFO", "json")
        structlog.get_logger("t").warning("to_the_first", n=1)
    first.close()  # as a test's captured output is closed when the test ends
    with contextlib.redirect_stderr(second):
        structlog.get_logger("t").warning("to_the_second", n=2)  # raised ValueError before
    [line] = second.getvalue().splitlines()
    assert json.loads(line)["event"] == "to_the_second"
    assert json.loads(line)["n"] == 2
