"""Meta's webhook signature: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256(app secret, raw body)>`."""

from __future__ import annotations

import hashlib
import hmac

from app.errors import ChannelAuthError

SIGNATURE_HEADER = "x-hub-signature-256"


def verify(app_secret: str, header: str | None, body: bytes) -> None:
    """Raise `ChannelAuthError` with the reason unless `header` signs `body`."""
    if not header:
        raise ChannelAuthError("missing X-Hub-Signature-256 header")
    scheme, _, given = header.strip().partition("=")
    if scheme != "sha256" or not given:
        raise ChannelAuthError("X-Hub-Signature-256 must be sha256=<hex>")
    expected = hmac.new(app_secret.encode(), body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, given.lower()):
        raise ChannelAuthError("signature does not match")
