"""Slack request signing: `v0=` + hex HMAC-SHA256(signing secret, "v0:{timestamp}:{raw body}")."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from app.errors import ChannelAuthError
from channels.common.freshness import require_fresh

SIGNATURE_HEADER = "x-slack-signature"
TIMESTAMP_HEADER = "x-slack-request-timestamp"


def verify(
    secret: str, headers: Mapping[str, str], body: bytes, *, tolerance: int = 300, now: float | None = None
) -> None:
    """Raise `ChannelAuthError` with the reason unless the request is signed by Slack and fresh."""
    timestamp = headers.get(TIMESTAMP_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if not timestamp:
        raise ChannelAuthError("missing X-Slack-Request-Timestamp header")
    if not signature:
        raise ChannelAuthError("missing X-Slack-Signature header")
    require_fresh(
        timestamp,
        tolerance,
        not_a_number="X-Slack-Request-Timestamp must be unix seconds",
        too_far="request timestamp is more than {tolerance} s away from server time",
        now=now,
    )
    base = b"v0:" + timestamp.encode() + b":" + body
    expected = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        raise ChannelAuthError("X-Slack-Signature does not match")
