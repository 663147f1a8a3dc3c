"""Inbound callbacks shared by WeCom and WeChat Official Accounts, failures as request errors.

Both platforms sign the query (`timestamp`, `nonce`), post flat XML, and in encrypted
mode wrap the message in an `Encrypt` element. A callback that fails a check becomes the
core's typed request error (401, 403 or 400), never a 500.
"""

from __future__ import annotations

import time

from app.errors import ChannelAuthError, ChannelForbidden, InvalidPayload
from channels.common.wechat_crypto import (
    DecryptError,
    ReceiveIdMismatch,
    SignatureMismatch,
    WeChatCrypto,
    timestamp_fresh,
)
from channels.common.wechat_xml import MalformedXml, UnsafeXml, WeChatMessage, parse_flat_xml


def require_fresh(timestamp: str, nonce: str, tolerance_seconds: float) -> None:
    """Both signed query values are present and the timestamp is within the tolerance."""
    if not timestamp or not nonce:
        raise InvalidPayload("timestamp and nonce are required")
    if not timestamp_fresh(timestamp, tolerance_seconds, time.time()):
        raise ChannelAuthError("timestamp is malformed or too far from now")


def parse_callback(data: bytes | str) -> dict[str, str]:
    try:
        return parse_flat_xml(data)
    except (UnsafeXml, MalformedXml) as exc:
        raise InvalidPayload(str(exc)) from exc


def open_encrypted(
    crypto: WeChatCrypto, signature: str, timestamp: str, nonce: str, encrypt: str, *, receive_id: str
) -> str:
    """The decrypted `Encrypt` value; `receive_id` names ours in errors ("AppID", "CorpID")."""
    try:
        return crypto.verify_and_decrypt(signature, timestamp, nonce, encrypt)
    except SignatureMismatch as exc:
        raise ChannelAuthError("msg_signature does not match") from exc
    except ReceiveIdMismatch as exc:
        raise ChannelForbidden(f"the message was encrypted for another {receive_id}") from exc
    except DecryptError as exc:
        raise InvalidPayload(f"Encrypt cannot be decrypted: {exc}") from exc


def message_of(fields: dict[str, str]) -> WeChatMessage:
    try:
        return WeChatMessage.from_fields(fields)
    except MalformedXml as exc:
        raise InvalidPayload(str(exc)) from exc
