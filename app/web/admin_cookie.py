"""The admin session cookie: an expiry time signed with a key derived from ADMIN_TOKEN.

The cookie carries no secret and no state: `"{expires}.{hex hmac}"`. Deriving the key
from the admin token means rotating ADMIN_TOKEN logs every browser out, and a leaked
cookie stops working at its expiry without any server-side session table.
"""

from __future__ import annotations

import hashlib
import hmac
import time

COOKIE_NAME = "chatgate_admin"
COOKIE_PATH = "/admin"
DEFAULT_TTL_SECONDS = 12 * 3600

_CONTEXT = b"chatgate admin session cookie v1"


def _mac(admin_token: str, expires: int) -> str:
    key = hmac.new(admin_token.encode(), _CONTEXT, hashlib.sha256).digest()
    return hmac.new(key, str(expires).encode(), hashlib.sha256).hexdigest()


def sign_admin_cookie(admin_token: str, *, ttl: int = DEFAULT_TTL_SECONDS, now: float | None = None) -> str:
    """A cookie value valid for `ttl` seconds."""
    expires = int(now if now is not None else time.time()) + ttl
    return f"{expires}.{_mac(admin_token, expires)}"


def verify_admin_cookie(admin_token: str, value: str | None, *, now: float | None = None) -> bool:
    """True when `value` was signed with this token and has not expired."""
    if not value:
        return False
    expires_text, _, mac = value.partition(".")
    if not expires_text.isdigit() or not mac:
        return False
    expires = int(expires_text)
    if expires < (now if now is not None else time.time()):
        return False
    return hmac.compare_digest(mac.encode(), _mac(admin_token, expires).encode())
