"""QQ bot webhook signatures (Ed25519), as the QQ bot platform documents them.

The key pair is derived from the bot secret: the secret is repeated until it is at least
32 bytes long and its first 32 bytes are the Ed25519 seed. The platform signs
`X-Signature-Timestamp + raw body` with it (`X-Signature-Ed25519`, hex); we sign
`event_ts + plain_token` to answer the callback-URL validation (op 13).
"""

from __future__ import annotations

import binascii

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from app.errors import ChannelAuthError
from channels.common.freshness import require_fresh

SEED_SIZE = 32
SIGNATURE_HEADER = "x-signature-ed25519"
TIMESTAMP_HEADER = "x-signature-timestamp"


def private_key(secret: str) -> Ed25519PrivateKey:
    seed = secret.encode()
    if not seed:
        raise ValueError("the bot secret is empty")
    while len(seed) < SEED_SIZE:
        seed *= 2
    return Ed25519PrivateKey.from_private_bytes(seed[:SEED_SIZE])


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return key.sign(message).hex()


def verify(
    key: Ed25519PrivateKey,
    signature: str | None,
    timestamp: str | None,
    body: bytes,
    *,
    tolerance: int = 0,
    now: float | None = None,
) -> None:
    """Raise `ChannelAuthError` with the reason unless `body` carries a valid signature."""
    if not signature:
        raise ChannelAuthError("missing X-Signature-Ed25519 header")
    if not timestamp:
        raise ChannelAuthError("missing X-Signature-Timestamp header")
    try:
        raw = binascii.unhexlify(signature.strip())
    except (binascii.Error, ValueError) as exc:
        raise ChannelAuthError("X-Signature-Ed25519 is not hex") from exc
    if len(raw) != 64 or raw[63] & 224 != 0:
        raise ChannelAuthError("X-Signature-Ed25519 is not an Ed25519 signature")
    try:
        key.public_key().verify(raw, timestamp.encode() + body)
    except InvalidSignature as exc:
        raise ChannelAuthError("signature does not match") from exc
    if tolerance > 0:  # 0 turns the check off
        require_fresh(
            timestamp, tolerance, not_a_number="X-Signature-Timestamp must be unix seconds", now=now
        )
