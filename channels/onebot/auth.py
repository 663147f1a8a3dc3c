"""Who may talk to the OneBot channel: the access token of a bridge, the HTTP POST signature."""

from __future__ import annotations

import hashlib
import hmac

from app.errors import ChannelAuthError


def verify_signature(secret: str, header: str | None, body: bytes) -> None:
    if not header:
        raise ChannelAuthError("missing X-Signature header")
    algo, _, given = header.strip().partition("=")
    if algo.lower() != "sha1" or not given:
        raise ChannelAuthError("X-Signature must be sha1=<hex>")
    expected = hmac.new(secret.encode(), body, hashlib.sha1).hexdigest()
    if not hmac.compare_digest(expected.encode(), given.lower().encode()):
        raise ChannelAuthError("signature does not match")


def presented_token(authorization: str | None, query_token: str | None) -> str | None:
    if authorization:
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and token.strip():  # go-cqhttp once sent "Token"
            return token.strip()
        return None
    return query_token or None
