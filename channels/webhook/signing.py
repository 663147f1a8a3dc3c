"""The webhook signature: `sha256=` + hex HMAC-SHA256(secret, "{timestamp}.{raw body}")."""

from __future__ import annotations

import hashlib
import hmac
import time

from app.errors import ChannelAuthError

SIGNATURE_HEADER = "x-chatgate-signature"
TIMESTAMP_HEADER = "x-chatgate-timestamp"


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


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
