"""The webhook signature: `sha256=` + hex HMAC-SHA256(secret, "{timestamp}.{raw body}")."""

from __future__ import annotations

import hmac
import time

from app.errors import ChannelAuthError
from app.signed_callback import SIGNATURE_HEADER, TIMESTAMP_HEADER, sign

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
    try:
        ts = int(timestamp)
    except ValueError as exc:
        raise ChannelAuthError("X-Chatgate-Timestamp must be unix seconds") from exc
    now = time.time() if now is None else now
    if abs(now - ts) > tolerance:
        raise ChannelAuthError(f"timestamp is more than {tolerance} s away from server time")
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().encode()):
        raise ChannelAuthError("signature does not match")
