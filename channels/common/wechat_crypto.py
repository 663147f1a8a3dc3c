"""WXBizMsgCrypt: the callback signature and encryption of WeCom and WeChat Official Accounts.

The published rule (WeCom "加解密方案说明", Official Account "消息加解密说明"):

- signature = hex SHA1 of the lexicographically sorted concatenation of
  `[token, timestamp, nonce, encrypt]` (plaintext Official Accounts sign only
  `[token, timestamp, nonce]`);
- AESKey = base64decode(EncodingAESKey + "="), 32 bytes; AES-256-CBC with IV = AESKey[:16];
  PKCS#7 padding to a multiple of 32 bytes;
- plaintext = 16 random bytes + 4-byte big-endian length of msg + msg + receive id
  (the CorpID for WeCom apps, the AppID for Official Accounts), which must match ours.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import struct
from collections.abc import Sequence

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

_BLOCK = 32  # the padding block of the scheme (not AES's 16-byte block)
_RANDOM_BYTES = 16


class WeChatCryptoError(Exception):
    """A callback that cannot be trusted or read."""


class SignatureMismatch(WeChatCryptoError):
    pass


class DecryptError(WeChatCryptoError):
    pass


class ReceiveIdMismatch(WeChatCryptoError):
    def __init__(self, received: str) -> None:
        super().__init__(f"receive id {received[:64]!r} is not ours")
        self.received = received


def sha1_signature(*values: str) -> str:
    """hex SHA1 of the sorted concatenation of `values` (the platform's signature rule)."""
    return hashlib.sha1("".join(sorted(values)).encode()).hexdigest()


def signature_matches(expected: str, given: str | None) -> bool:
    """Constant-time comparison; hex case is ignored."""
    if not given:
        return False
    return hmac.compare_digest(expected.encode(), given.strip().lower().encode())


def decode_aes_key(encoding_aes_key: str) -> bytes:
    """The 32-byte AES key from the 43-character EncodingAESKey; ValueError when malformed."""
    if len(encoding_aes_key) != 43:
        raise ValueError("EncodingAESKey must be 43 characters long")
    try:
        key = base64.b64decode(encoding_aes_key + "=", validate=True)
    except binascii.Error as exc:
        raise ValueError(f"EncodingAESKey is not base64: {exc}") from exc
    if len(key) != 32:
        raise ValueError("EncodingAESKey does not decode to 32 bytes")
    return key


class WeChatCrypto:
    """Signs, verifies, encrypts and decrypts callbacks for one token / key / receive id.

    `previous_aes_keys` lets an operator rotate the EncodingAESKey: the Official Account
    docs ask receivers to try the previous key when the current one fails.
    """

    def __init__(
        self,
        token: str,
        encoding_aes_key: str,
        receive_id: str,
        *,
        previous_aes_keys: Sequence[str] = (),
    ) -> None:
        if not token:
            raise ValueError("token must not be empty")
        self.token = token
        self.receive_id = receive_id
        self._keys = [decode_aes_key(encoding_aes_key)] + [decode_aes_key(k) for k in previous_aes_keys]

    # --- signature ---------------------------------------------------------------------

    def sign(self, timestamp: str, nonce: str, encrypt: str) -> str:
        return sha1_signature(self.token, timestamp, nonce, encrypt)

    def verify(self, signature: str | None, timestamp: str, nonce: str, encrypt: str) -> None:
        if not signature_matches(self.sign(timestamp, nonce, encrypt), signature):
            raise SignatureMismatch("msg_signature does not match")

    # --- encryption --------------------------------------------------------------------

    def encrypt(self, message: str, *, random_prefix: bytes | None = None) -> str:
        """base64 ciphertext of `message` for our receive id (with the current key)."""
        prefix = os.urandom(_RANDOM_BYTES) if random_prefix is None else random_prefix
        if len(prefix) != _RANDOM_BYTES:
            raise ValueError("random prefix must be 16 bytes")
        body = message.encode()
        plain = prefix + struct.pack(">I", len(body)) + body + self.receive_id.encode()
        pad = _BLOCK - len(plain) % _BLOCK
        plain += bytes([pad]) * pad
        key = self._keys[0]
        encryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).encryptor()
        return base64.b64encode(encryptor.update(plain) + encryptor.finalize()).decode()

    def decrypt(self, encrypt: str) -> str:
        """The message inside `encrypt`; raises when it is unreadable or not for us."""
        try:
            data = base64.b64decode(encrypt, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise DecryptError("ciphertext is not base64") from exc
        if not data or len(data) % 16:
            raise DecryptError("ciphertext length is not a multiple of the AES block")
        failure: WeChatCryptoError = DecryptError("ciphertext does not decrypt with our key")
        for key in self._keys:
            try:
                message, receive_id = _open(key, data)
            except DecryptError as exc:
                if not isinstance(failure, ReceiveIdMismatch):
                    failure = exc
                continue
            if hmac.compare_digest(receive_id.encode(), self.receive_id.encode()):
                return message
            # A wrong key can, rarely, yield valid padding: try the other keys first.
            failure = ReceiveIdMismatch(receive_id)
        raise failure

    def verify_and_decrypt(self, signature: str | None, timestamp: str, nonce: str, encrypt: str) -> str:
        self.verify(signature, timestamp, nonce, encrypt)
        return self.decrypt(encrypt)

    def encrypted_reply(self, message: str, timestamp: str, nonce: str) -> str:
        """A passive-reply XML document (`Encrypt`, `MsgSignature`, `TimeStamp`, `Nonce`)."""
        encrypt = self.encrypt(message)
        signature = self.sign(timestamp, nonce, encrypt)
        return (
            f"<xml><Encrypt><![CDATA[{encrypt}]]></Encrypt>"
            f"<MsgSignature><![CDATA[{signature}]]></MsgSignature>"
            f"<TimeStamp>{timestamp}</TimeStamp>"
            f"<Nonce><![CDATA[{nonce}]]></Nonce></xml>"
        )


def _open(key: bytes, data: bytes) -> tuple[str, str]:
    decryptor = Cipher(algorithms.AES(key), modes.CBC(key[:16])).decryptor()
    plain = decryptor.update(data) + decryptor.finalize()
    pad = plain[-1]
    if not 1 <= pad <= _BLOCK or plain[-pad:] != bytes([pad]) * pad:
        raise DecryptError("bad padding (wrong EncodingAESKey?)")
    plain = plain[:-pad]
    if len(plain) < _RANDOM_BYTES + 4:
        raise DecryptError("decrypted payload is too short")
    (length,) = struct.unpack(">I", plain[_RANDOM_BYTES : _RANDOM_BYTES + 4])
    start = _RANDOM_BYTES + 4
    if start + length > len(plain):
        raise DecryptError("message length field is larger than the payload")
    try:
        message = plain[start : start + length].decode()
        receive_id = plain[start + length :].decode()
    except UnicodeDecodeError as exc:
        raise DecryptError("decrypted payload is not UTF-8") from exc
    return message, receive_id


def timestamp_fresh(timestamp: str, tolerance_seconds: float, now: float) -> bool:
    """Whether a callback's `timestamp` is within `tolerance_seconds` of `now` (0: no check)."""
    try:
        value = int(timestamp)
    except ValueError:
        return False
    if tolerance_seconds <= 0:
        return True
    return abs(now - value) <= tolerance_seconds
