"""`X-Line-Signature`: base64 HMAC-SHA256 of the raw body with the channel secret.

Checked with the official SDK's validator (constant-time comparison) over the raw bytes,
before anything in the body is looked at.
"""

from __future__ import annotations

from linebot.v3.webhook import SignatureValidator

from app.errors import ChannelAuthError

SIGNATURE_HEADER = "x-line-signature"


def verify(channel_secret: str, body: bytes, signature: str | None) -> None:
    if not signature:
        raise ChannelAuthError("missing X-Line-Signature header")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ChannelAuthError("body is not UTF-8: cannot match X-Line-Signature") from None
    try:
        valid = SignatureValidator(channel_secret).validate(text, signature)
    except (UnicodeEncodeError, TypeError):  # a header that is not ASCII cannot match
        valid = False
    if not valid:
        raise ChannelAuthError("X-Line-Signature does not match the body")
