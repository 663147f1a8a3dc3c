"""Feishu callback security: the request signature and encrypted bodies.

Both follow Feishu's published rules (and lark-oapi's `EventDispatcherHandler`, which the
tests use as the oracle):

- `X-Lark-Signature` = hex SHA-256 of `X-Lark-Request-Timestamp + X-Lark-Request-Nonce +
  Encrypt Key + raw body`. Feishu signs only when an Encrypt Key is configured.
- `{"encrypt": base64}`: AES-256-CBC, key = SHA-256 of the Encrypt Key, IV = the first 16
  bytes of the decoded data, PKCS#7 padding.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Mapping

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.errors import ChannelAuthError
from channels.common.freshness import require_fresh

TIMESTAMP_HEADER = "x-lark-request-timestamp"
NONCE_HEADER = "x-lark-request-nonce"
SIGNATURE_HEADER = "x-lark-signature"
_BLOCK = 16


def has_signature(headers: Mapping[str, str]) -> bool:
    return any(headers.get(h) for h in (TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER))


def verify_signature(
    encrypt_key: str,
    headers: Mapping[str, str],
    body: bytes,
    *,
    tolerance: int = 300,
    now: float | None = None,
) -> None:
    """Raise `ChannelAuthError` with the reason unless the request is signed with our key and fresh."""
    timestamp = headers.get(TIMESTAMP_HEADER)
    nonce = headers.get(NONCE_HEADER)
    signature = headers.get(SIGNATURE_HEADER)
    if not timestamp:
        raise ChannelAuthError("missing X-Lark-Request-Timestamp header")
    if nonce is None or nonce == "":
        raise ChannelAuthError("missing X-Lark-Request-Nonce header")
    if not signature:
        raise ChannelAuthError("missing X-Lark-Signature header")
    require_fresh(
        timestamp,
        # 0 turns the age check off; the timestamp must still be a number
        tolerance if tolerance > 0 else float("inf"),
        not_a_number="X-Lark-Request-Timestamp must be unix seconds",
        too_far="request timestamp is more than {tolerance} s away from server time",
        now=now,
    )
    expected = signature_of(timestamp, nonce, encrypt_key, body)
    if not hmac.compare_digest(expected.encode(), signature.strip().lower().encode()):
        raise ChannelAuthError("X-Lark-Signature does not match")


def signature_of(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def decrypt(encrypt_key: str, encrypted: str) -> bytes:
    """The plaintext of an `encrypt` field; `ChannelAuthError` when it was not made with our key."""
    try:
        data = base64.b64decode(encrypted, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ChannelAuthError("encrypt is not base64") from exc
    if len(data) < 2 * _BLOCK or len(data) % _BLOCK:
        raise ChannelAuthError("encrypt has an impossible length for AES-CBC")
    key = hashlib.sha256(encrypt_key.encode()).digest()
    decryptor = Cipher(algorithms.AES(key), modes.CBC(data[:_BLOCK])).decryptor()
    padded = decryptor.update(data[_BLOCK:]) + decryptor.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    try:
        return unpadder.update(padded) + unpadder.finalize()
    except ValueError as exc:
        # Wrong key (or tampered data): the padding does not check out.
        raise ChannelAuthError("encrypt cannot be decrypted with FEISHU_ENCRYPT_KEY") from exc


def same_secret(expected: str, given: str) -> bool:
    """Constant-time comparison of two secrets."""
    return hmac.compare_digest(expected.encode(), given.encode())
