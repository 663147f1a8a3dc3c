"""When a job fires: cron expressions (croniter) in an IANA time zone, and one-shot times.

Pure functions of their arguments (the current time is always passed in), so the
scheduler can be tested with any clock.
"""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter


class InvalidSchedule(ValueError):
    """A cron expression, time zone or one-shot time that cannot be used; the message says why."""


def zone(name: str) -> ZoneInfo:
    """The IANA time zone `name` (`Asia/Shanghai`, `UTC`), or `InvalidSchedule`."""
    if not name or name != name.strip():
        raise InvalidSchedule(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise InvalidSchedule(f"unknown time zone {name!r} (use an IANA name like Europe/Berlin)") from exc


def check_cron(expression: str, *, minute_resolution: bool = False) -> str:
    """Validate a cron expression and return it stripped.

    Five fields (`m h dom mon dow`) or an alias like `@daily`; croniter's six-field form
    (seconds last) is refused when `minute_resolution` is asked for (the agent's tool).
    """
    expr = " ".join(expression.split())
    if not expr:
        raise InvalidSchedule("empty cron expression")
    fields = expr.split(" ")
    if minute_resolution and not expr.startswith("@") and len(fields) != 5:
        raise InvalidSchedule(
            f"cron expression {expression!r} must have 5 fields: minute hour day month weekday"
        )
    if not expr.startswith("@") and len(fields) not in (5, 6):
        raise InvalidSchedule(f"cron expression {expression!r} must have 5 fields (or 6 with seconds)")
    if not croniter.is_valid(expr):
        raise InvalidSchedule(f"invalid cron expression {expression!r}")
    return expr


def next_cron_fire(expression: str, timezone: str, after: datetime) -> datetime:
    """The first fire strictly after `after`, in UTC; the expression is read in `timezone`."""
    if after.tzinfo is None:
        raise ValueError("`after` must be timezone-aware")
    local = after.astimezone(zone(timezone))
    try:
        fire = croniter(check_cron(expression), local).get_next(datetime)
    except (CroniterError, ValueError) as exc:  # e.g. "0 0 30 2 *" never matches
        raise InvalidSchedule(f"cron expression {expression!r} has no next fire: {exc}") from exc
    return fire.astimezone(UTC)


def parse_at(value: str | datetime, timezone: str = "UTC") -> datetime:
    """An ISO-8601 time in UTC; a time without an offset is read in `timezone`."""
    if isinstance(value, datetime):
        moment = value
    else:
        text = value.strip()
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.fromisoformat(text)
        except ValueError as exc:
            raise InvalidSchedule(f"{value!r} is not an ISO-8601 time like 2026-12-24T18:00") from exc
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=zone(timezone))
    return moment.astimezone(UTC)
