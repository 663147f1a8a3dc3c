"""Fire times: cron expressions read in IANA time zones, one-shot times, bad input."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from app.scheduling import InvalidSchedule, check_cron, next_cron_fire, parse_at


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=UTC)


def test_a_cron_in_shanghai_fires_at_the_right_utc_instant() -> None:
    # 09:00 in Shanghai (UTC+8, no DST) is 01:00 UTC.
    assert next_cron_fire("0 9 * * *", "Asia/Shanghai", utc(2026, 12, 2, 11, 0)) == utc(2026, 12, 3, 1, 0)
    # Just before 01:00 UTC the same day's 09:00 local is still ahead.
    assert next_cron_fire("0 9 * * *", "Asia/Shanghai", utc(2026, 12, 2, 0, 59)) == utc(2026, 12, 2, 1, 0)
    # The next fire is strictly after `after`.
    assert next_cron_fire("0 9 * * *", "Asia/Shanghai", utc(2026, 12, 2, 1, 0)) == utc(2026, 12, 3, 1, 0)


def test_weekday_schedules_use_the_local_date() -> None:
    # Monday 06:00 in Shanghai is Sunday 22:00 UTC.
    fire = next_cron_fire("0 6 * * 1", "Asia/Shanghai", utc(2026, 12, 2, 0, 0))  # a Wednesday
    assert fire == utc(2026, 12, 6, 22, 0)
    assert fire.weekday() == 6  # Sunday in UTC


def test_daylight_saving_time_changes_the_utc_instant() -> None:
    # 09:00 in New York is 14:00 UTC in winter and 13:00 UTC in summer.
    assert next_cron_fire("0 9 * * *", "America/New_York", utc(2026, 1, 10, 0, 0)) == utc(2026, 1, 10, 14, 0)
    assert next_cron_fire("0 9 * * *", "America/New_York", utc(2026, 7, 10, 0, 0)) == utc(2026, 7, 10, 13, 0)


@pytest.mark.parametrize(
    "expression", ["", "61 * * * *", "* * *", "0 9 * * * * * *", "every day", "0 0 30 2 *"]
)
def test_bad_cron_expressions_are_refused(expression: str) -> None:
    with pytest.raises(InvalidSchedule):
        next_cron_fire(expression, "UTC", utc(2026, 1, 1))


def test_minute_resolution_refuses_second_fields() -> None:
    assert check_cron("*/5  * * * *") == "*/5 * * * *"
    assert check_cron("@daily", minute_resolution=True) == "@daily"
    assert check_cron("* * * * * */10") == "* * * * * */10"
    with pytest.raises(InvalidSchedule, match="5 fields"):
        check_cron("* * * * * */10", minute_resolution=True)


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "utc ", "../etc/passwd"])
def test_unknown_time_zones_are_refused(name: str) -> None:
    with pytest.raises(InvalidSchedule, match="time zone"):
        next_cron_fire("0 9 * * *", name, utc(2026, 1, 1))


def test_one_shot_times() -> None:
    assert parse_at("2026-12-24T18:00", "Asia/Shanghai") == utc(2026, 12, 24, 10, 0)
    assert parse_at("2026-12-24T18:00Z", "Asia/Shanghai") == utc(2026, 12, 24, 18, 0)
    assert parse_at("2026-12-24T18:00+01:00") == utc(2026, 12, 24, 17, 0)
    with pytest.raises(InvalidSchedule, match="ISO-8601"):
        parse_at("tomorrow at six")
