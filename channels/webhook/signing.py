"""The webhook signature: `sha256=` + hex HMAC-SHA256(secret, "{timestamp}.{raw body}")."""

from __future__ import annotations

import hmac

from app.errors import ChannelAuthError
from app.signed_callback import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign
from channels.common.freshness import require_fresh

__all__ = ["SIGNATURE_HEADER", "TIMESTAMP_HEADER", "sign", "verify"]


def verify(
    secret: str,
    timestamp: str | None,
    signature: str | None,
    body: bytes,
    *,
    tolerance: int = 300,
    now: float | None = None,
) -> None:
    """Raise `ChannelAuthError` with the reason unless the request is signed and fresh."""
    if not timestamp:
        raise ChannelAuthError("missing X-Chatgate-Timestamp header")
    if not signature:
        raise ChannelAuthError("missing X-Chatgate-Signature header")
    require_fresh(timestamp, tolerance, not_a_number="X-Chatgate-Timestamp must be unix seconds", now=now)
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        raise ChannelAuthError("signature does not match")
