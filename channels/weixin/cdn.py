"""WeChat CDN media: AES-128-ECB (PKCS#7) both ways, as Tencent's client does (cdn/*.ts).

Download: `GET {cdn}/download?encrypted_query_param=…`, then decrypt with the item's key.
Keys come two ways: base64 of the 16 raw bytes (images' `media.aes_key`), or base64 of
the key's 32 hex characters (files, voice, video); an image's `image_item.aeskey` (hex)
is preferred when present.

Upload: a random 16-byte key and file key, `getuploadurl` with the plaintext's size and
MD5 and the ciphertext's size, then `POST` the ciphertext to the upload URL; the CDN
answers the download parameter in the `x-encrypted-param` header.

Only the operator's `WEIXIN_CDN_BASE_URL` is fetched: a `full_url` in a message or an
`upload_full_url` in an answer is used only when it lies under that base.
"""

from __future__ import annotations

import base64
import hashlib
import re
import secrets
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from app.fetch import GuardedFetcher
from channels.common.media import Media, download_capped
from channels.weixin.api import ILinkClient
from channels.weixin.parse import MediaRef

_HEX32 = re.compile(r"^[0-9a-fA-F]{32}$")


class MediaKeyError(ValueError):
    """An AES key that is neither 16 bytes nor 32 hex characters."""


def encrypt(plaintext: bytes, key: bytes) -> bytes:
    padder = padding.PKCS7(128).padder()
    data = padder.update(plaintext) + padder.finalize()
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()  # ECB: the CDN's scheme
    return enc.update(data) + enc.finalize()


def decrypt(ciphertext: bytes, key: bytes) -> bytes:
    dec = Cipher(algorithms.AES(key), modes.ECB()).decryptor()  # ECB: the CDN's scheme
    data = dec.update(ciphertext) + dec.finalize()
    unpadder = padding.PKCS7(128).unpadder()
    return unpadder.update(data) + unpadder.finalize()


def padded_size(size: int) -> int:
    return (size // 16 + 1) * 16


def media_key(ref: MediaRef) -> bytes | None:
    """The 16-byte key of a media item; None when it is not encrypted (a plain image)."""
    if ref.aes_key_hex and _HEX32.match(ref.aes_key_hex):
        return bytes.fromhex(ref.aes_key_hex)
    if not ref.aes_key:
        return None
    try:
        raw = base64.b64decode(ref.aes_key, validate=True)
    except ValueError as exc:
        raise MediaKeyError("aes_key is not base64") from exc
    if len(raw) == 16:
        return raw
    if len(raw) == 32 and _HEX32.match(raw.decode("ascii", "replace")):
        return bytes.fromhex(raw.decode("ascii"))
    raise MediaKeyError(f"aes_key decodes to {len(raw)} bytes, neither a key nor its hex")


def _under(url: str | None, base: str) -> bool:
    return bool(url) and str(url).startswith(base.rstrip("/") + "/")


def download_url(ref: MediaRef, cdn_base: str) -> str | None:
    if _under(ref.full_url, cdn_base):
        return ref.full_url
    if not ref.encrypt_query_param:
        return None
    return f"{cdn_base.rstrip('/')}/download?encrypted_query_param={quote(ref.encrypt_query_param, safe='')}"


async def download(fetcher: GuardedFetcher, ref: MediaRef, cdn_base: str, limit: int) -> Media | None:
    """The item's plaintext bytes (at most `limit` on the wire: ciphertext is never smaller).
    Only URLs under the CDN base the operator configured are fetched (`download_url`)."""
    url = download_url(ref, cdn_base)
    if url is None:
        return None
    fetched = await download_capped(fetcher, url, limit, trusted=(cdn_base,))
    key = media_key(ref)
    return Media(decrypt(fetched.data, key) if key is not None else fetched.data)


@dataclass(frozen=True)
class Uploaded:
    download_param: str  # the CDN's x-encrypted-param: the item's encrypt_query_param
    aes_key_hex: str
    size: int  # plaintext bytes
    cipher_size: int


async def upload(
    client: ILinkClient, http: httpx.AsyncClient, data: bytes, *, media_type: int, to_user: str, cdn_base: str
) -> Uploaded:
    key = secrets.token_bytes(16)
    filekey = secrets.token_hex(16)
    ciphertext = encrypt(data, key)
    answer = await client.get_upload_url(
        {
            "filekey": filekey,
            "media_type": media_type,
            "to_user_id": to_user,
            "rawsize": len(data),
            "rawfilemd5": hashlib.md5(data).hexdigest(),  # the API asks for MD5
            "filesize": len(ciphertext),
            "no_need_thumb": True,
            "aeskey": key.hex(),
        }
    )
    full = str(answer.get("upload_full_url") or "").strip()
    param = answer.get("upload_param")
    if _under(full, cdn_base):
        url = full
    elif param:
        url = (
            f"{cdn_base.rstrip('/')}/upload?encrypted_query_param={quote(str(param), safe='')}"
            f"&filekey={quote(filekey, safe='')}"
        )
    else:
        raise ValueError("getuploadurl gave no upload URL under WEIXIN_CDN_BASE_URL")
    resp = await http.post(url, content=ciphertext, headers={"Content-Type": "application/octet-stream"})
    resp.raise_for_status()
    download_param = resp.headers.get("x-encrypted-param")
    if not download_param:
        raise ValueError("CDN upload answer has no x-encrypted-param header")
    return Uploaded(download_param, key.hex(), len(data), len(ciphertext))


def cdn_media(uploaded: Uploaded) -> dict[str, object]:
    """The `CDNMedia` of an uploaded item, as Tencent's client sends it (key: base64 of its hex)."""
    return {
        "encrypt_query_param": uploaded.download_param,
        "aes_key": base64.b64encode(uploaded.aes_key_hex.encode()).decode(),
        "encrypt_type": 1,
    }
