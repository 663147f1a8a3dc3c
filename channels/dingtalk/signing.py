"""DingTalk HTTP callback signing: `sign` = Base64(HMAC-SHA256(secret, timestamp + "\\n" + secret)).

`timestamp` is milliseconds since the epoch; DingTalk documents that a request more than
one hour away from the server's time must be refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping

from app.errors import ChannelAuthError
from channels.common.freshness import require_fresh

TIMESTAMP_HEADER = "timestamp"
SIGN_HEADER = "sign"


def verify(
    secret: str,
    headers: Mapping[str, str],
    *,
    tolerance_seconds: int = 3600,
    now: float | None = None,
) -> None:
    """Raise `ChannelAuthError` with the reason unless the request is signed with `secret` and fresh."""
    timestamp = headers.get(TIMESTAMP_HEADER)
    sign = headers.get(SIGN_HEADER)
    if not timestamp:
        raise ChannelAuthError("missing timestamp header")
    if not sign:
        raise ChannelAuthError("missing sign header")
    require_fresh(
        timestamp,
        tolerance_seconds,
        not_a_number="timestamp must be milliseconds since the epoch",
        per_second=1000,
        now=now,
    )
    mac = hmac.new(secret.encode(), f"{timestamp}\n{secret}".encode(), hashlib.sha256).digest()
    expected = base64.b64encode(mac)
    if not hmac.compare_digest(expected, sign.strip().encode()):
        raise ChannelAuthError("sign does not match")
