"""The one signed-timestamp age check, as each platform's caller words it."""

from __future__ import annotations

import pytest

from app.errors import ChannelAuthError
from channels.common.freshness import require_fresh

NOW = 1_700_000_000.0


def test_within_the_tolerance_passes_on_either_side_in_seconds_and_milliseconds() -> None:
    require_fresh(str(int(NOW - 300)), 300, not_a_number="nan", now=NOW)
    require_fresh(str(int(NOW + 300)), 300, not_a_number="nan", now=NOW)
    require_fresh(str(int(NOW * 1000) - 3_600_000), 3600, not_a_number="nan", per_second=1000, now=NOW)


def test_too_old_or_too_new_is_refused_with_the_callers_wording() -> None:
    with pytest.raises(ChannelAuthError, match=r"^timestamp is more than 300 s away from server time$"):
        require_fresh(str(int(NOW - 301)), 300, not_a_number="nan", now=NOW)
    with pytest.raises(ChannelAuthError, match=r"^request timestamp is more than 60 s away"):
        require_fresh(
            str(int(NOW + 61)),
            60,
            not_a_number="nan",
            too_far="request timestamp is more than {tolerance} s away from server time",
            now=NOW,
        )
    # one millisecond past the hour, in milliseconds
    with pytest.raises(ChannelAuthError, match="more than 3600 s"):
        require_fresh(str(int(NOW * 1000) - 3_600_001), 3600, not_a_number="nan", per_second=1000, now=NOW)


def test_a_timestamp_that_is_not_an_integer_is_refused_with_the_callers_reason() -> None:
    with pytest.raises(ChannelAuthError, match=r"^X-Slack-Request-Timestamp must be unix seconds$"):
        require_fresh("12.5", 300, not_a_number="X-Slack-Request-Timestamp must be unix seconds", now=NOW)
