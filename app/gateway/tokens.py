"""Gateway tokens: who a browser connection is and which session keys it may attach to.

Two kinds: static tokens from settings (`GATEWAY_TOKENS`) and short-lived signed tokens
issued by the admin API. A signed token is
`cg1.<base64url(JSON claims)>.<base64url(HMAC-SHA256(secret, "cg1.<claims part>"))>`
with claims `sub`, `keys`, `prefix`, `exp`, `iat`; nothing is stored server-side, so any
replica with the same secret accepts it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from app.config import GatewayTokenSpec

PREFIX = "cg1"


class TokenInvalid(Exception):
    """The token is unknown, malformed, wrongly signed or expired."""


class TokenExpired(TokenInvalid):
    pass


@dataclass(frozen=True)
class GatewayGrant:
    """What an authenticated connection may do."""

    subject: str
    session_keys: tuple[str, ...] = ()
    key_prefix: str | None = None
    expires_at: float | None = None  # unix seconds; None for static tokens
    signed: bool = False
    extra: dict[str, object] = field(default_factory=dict, compare=False)

    def allows(self, key: str) -> bool:
        """Whether the grant covers `key`: an exact listed key or one under the prefix.

        A prefix matches whole key components: `web:a` grants `web:a` and `web:a:…`, never
        `web:ab`. A prefix ending in `:` (`web:`) grants the keys below it; `""` grants all.
        """
        if key in self.session_keys:
            return True
        return self.key_prefix is not None and prefix_covers(self.key_prefix, key)

    @property
    def default_key(self) -> str | None:
        return self.session_keys[0] if self.session_keys else None

    def expired(self, now: float | None = None) -> bool:
        return self.expires_at is not None and (now or time.time()) >= self.expires_at


def prefix_covers(prefix: str, key: str) -> bool:
    """Whether the key prefix `prefix` grants `key`, component by component."""
    if not prefix or prefix.endswith(":"):
        return key.startswith(prefix)
    return key == prefix or key.startswith(prefix + ":")


_ESCAPE = re.compile("%(?![0-9A-Fa-f]{2})")


def prefix_problem(prefix: str) -> str | None:
    """Why `prefix` cannot be a key prefix, or None: it must end at a component boundary."""
    if _ESCAPE.search(prefix) or re.search("%[0-9A-Fa-f]?$", prefix):
        return "key_prefix cuts an escape (%XX) in two: it must end at a component boundary"
    if "::" in prefix or prefix.startswith(":"):
        return "key_prefix has an empty component"
    if any(ch in prefix for ch in "\x00\r\n"):
        return "key_prefix contains a control character"
    return None


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: str, signed_part: str) -> bytes:
    return hmac.new(secret.encode(), signed_part.encode(), hashlib.sha256).digest()


def issue_token(
    secret: str,
    *,
    subject: str,
    session_keys: Sequence[str] = (),
    key_prefix: str | None = None,
    ttl_seconds: float,
    now: float | None = None,
) -> tuple[str, GatewayGrant]:
    """Sign a short-lived token; returns it with the grant it carries."""
    now = now if now is not None else time.time()
    issued = int(now)
    # Rounded up: a token lives at least ttl_seconds (truncating could cut almost a second).
    expires = math.ceil(now + ttl_seconds)
    claims = {"sub": subject, "keys": list(session_keys), "prefix": key_prefix, "exp": expires, "iat": issued}
    body = _b64(json.dumps(claims, separators=(",", ":"), sort_keys=True).encode())
    signed_part = f"{PREFIX}.{body}"
    token = f"{signed_part}.{_b64(_mac(secret, signed_part))}"
    grant = GatewayGrant(subject, tuple(session_keys), key_prefix, float(expires), signed=True)
    return token, grant


class TokenVerifier:
    """Turns a presented token into a `GatewayGrant`, or raises `TokenInvalid`."""

    def __init__(self, static: Sequence[GatewayTokenSpec], secret: str | None) -> None:
        self._static = [
            (spec.token.encode(), GatewayGrant(spec.subject, tuple(spec.session_keys), spec.key_prefix))
            for spec in static
        ]
        self._secret = secret

    def verify(self, token: str, *, now: float | None = None) -> GatewayGrant:
        if not isinstance(token, str) or not token:
            raise TokenInvalid("no token")
        if token.startswith(PREFIX + "."):
            return self._verify_signed(token, now if now is not None else time.time())
        given = token.encode()
        found: GatewayGrant | None = None
        for value, grant in self._static:
            # Compare against every static token so timing says nothing about which matched.
            if hmac.compare_digest(given, value):
                found = grant
        if found is None:
            raise TokenInvalid("unknown token")
        return found

    def _verify_signed(self, token: str, now: float) -> GatewayGrant:
        if not self._secret:
            raise TokenInvalid("signed tokens are not enabled (GATEWAY_TOKEN_SECRET)")
        parts = token.split(".")
        if len(parts) != 3:
            raise TokenInvalid("malformed token")
        _, body, signature = parts
        try:
            given_mac = _unb64(signature)
        except ValueError as exc:
            raise TokenInvalid("malformed token") from exc
        if not hmac.compare_digest(given_mac, _mac(self._secret, f"{PREFIX}.{body}")):
            raise TokenInvalid("bad signature")
        try:
            claims = json.loads(_unb64(body))
            subject = claims["sub"]
            keys = tuple(claims.get("keys") or ())
            prefix = claims.get("prefix")
            expires = float(claims["exp"])
        except (ValueError, KeyError, TypeError) as exc:
            raise TokenInvalid("malformed claims") from exc
        if not isinstance(subject, str) or not all(isinstance(k, str) for k in keys):
            raise TokenInvalid("malformed claims")
        if prefix is not None and not isinstance(prefix, str):
            raise TokenInvalid("malformed claims")
        if now >= expires:
            raise TokenExpired("token expired")
        return GatewayGrant(subject, keys, prefix, expires, signed=True)
