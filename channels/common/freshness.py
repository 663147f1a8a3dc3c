"""The one check that a signed request's timestamp is recent (replay protection).

Webhook, Slack, DingTalk, QQ and Feishu sign a timestamp with the body and refuse a
request signed too long ago; the platforms differ in the header's name, its unit
(seconds or milliseconds) and the wording of the refusal, which each caller passes.
"""

from __future__ import annotations

import time

from app.errors import ChannelAuthError

__all__ = ["require_fresh"]

TOO_FAR = "timestamp is more than {tolerance} s away from server time"


def require_fresh(
    timestamp: str,
    tolerance: float,
    *,
    not_a_number: str,
    too_far: str = TOO_FAR,
    per_second: int = 1,
    now: float | None = None,
) -> None:
    """Raise `ChannelAuthError` unless the integer `timestamp` is within `tolerance` s of now.

    `per_second`: timestamp units per second (1000 for milliseconds). `not_a_number` and
    `too_far` (formatted with `tolerance`) are the refusals the channel has always given.
    """
    try:
        value = int(timestamp)
    except ValueError as exc:
        raise ChannelAuthError(not_a_number) from exc
    current = time.time() if now is None else now
    if abs(current * per_second - value) > tolerance * per_second:
        raise ChannelAuthError(too_far.format(tolerance=tolerance))
