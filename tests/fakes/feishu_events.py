"""Feishu's event callbacks, signed and encrypted as Feishu makes them (for `tests.fakes.feishu`).

Built from Feishu's published rules, independently of the adapter's code: AES-256-CBC with
key SHA-256(Encrypt Key) and a random IV in front, PKCS#7, base64; and `X-Lark-Signature` =
hex SHA-256(timestamp + nonce + Encrypt Key + body). The tests check these against
lark-oapi, the official SDK (`tests/channels/feishu/test_sdk_vectors.py`).
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import time
from typing import Any

from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

APP_ID = "cli_test0001"
APP_SECRET = "feishu-app-secret"
VERIFICATION_TOKEN = "feishu-verification-token"
ENCRYPT_KEY = "feishu-encrypt-key"
BOT_OPEN_ID = "ou_bot0001"
TENANT_KEY = "tenant0001"


# --- callbacks, as Feishu builds them -------------------------------------------------------

_ids = itertools.count(1)


def encrypt(plain: bytes, key: str = ENCRYPT_KEY, iv: bytes | None = None) -> str:
    """Feishu's rule: base64(IV + AES-256-CBC(SHA-256(key), IV, PKCS#7(plain)))."""
    iv = os.urandom(16) if iv is None else iv
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plain) + padder.finalize()
    encryptor = Cipher(algorithms.AES(hashlib.sha256(key.encode()).digest()), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(padded) + encryptor.finalize()).decode()


def sign(timestamp: str, nonce: str, body: bytes, key: str = ENCRYPT_KEY) -> str:
    """Feishu's rule: hex SHA-256(timestamp + nonce + Encrypt Key + raw body)."""
    return hashlib.sha256((timestamp + nonce + key).encode() + body).hexdigest()


def callback(
    payload: dict[str, Any],
    *,
    encrypt_key: str | None = ENCRYPT_KEY,
    signing_key: str | None = None,
    timestamp: int | None = None,
    nonce: str | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers of a callback: encrypted and signed when there is an Encrypt Key."""
    plain = json.dumps(payload, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json; charset=utf-8"}
    if encrypt_key is None:
        return plain, headers
    body = json.dumps({"encrypt": encrypt(plain, encrypt_key)}).encode()
    ts = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or f"nonce{next(_ids)}"
    headers.update(
        {
            "X-Lark-Request-Timestamp": ts,
            "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": sign(ts, nonce, body, signing_key or encrypt_key),
        }
    )
    return body, headers


def url_verification(challenge: str = "ajls384kdjx98XX", token: str = VERIFICATION_TOKEN) -> dict[str, Any]:
    return {"challenge": challenge, "token": token, "type": "url_verification"}


def _envelope(
    n: int,
    event_type: str,
    event: dict[str, Any],
    *,
    token: str,
    create_time: str,
    event_id: str | None = None,
) -> dict[str, Any]:
    """A schema 2.0 callback as Feishu posts it: the header, then the event."""
    return {
        "schema": "2.0",
        "header": {
            "event_id": event_id or f"{n:032x}",
            "event_type": event_type,
            "create_time": create_time,
            "token": token,
            "app_id": APP_ID,
            "tenant_key": TENANT_KEY,
        },
        "event": event,
    }


def message_event(
    message_type: str,
    content: dict[str, Any],
    *,
    chat_id: str = "oc_alice",
    chat_type: str = "p2p",
    sender: str = "ou_alice",
    mentions: list[dict[str, Any]] | None = None,
    root_id: str | None = None,
    parent_id: str | None = None,
    thread_id: str | None = None,
    event_id: str | None = None,
    message_id: str | None = None,
    token: str = VERIFICATION_TOKEN,
    event_type: str = "im.message.receive_v1",
    sender_type: str = "user",
) -> dict[str, Any]:
    n = next(_ids)
    now_ms = str(int(time.time() * 1000))
    message: dict[str, Any] = {
        "message_id": message_id or f"om_in{n:06d}",
        "create_time": now_ms,
        "update_time": now_ms,
        "chat_id": chat_id,
        "chat_type": chat_type,
        "message_type": message_type,
        "content": json.dumps(content, ensure_ascii=False),
        "user_agent": "Mozilla/5.0 Lark/7.30",
    }
    if mentions:
        message["mentions"] = mentions
    for name, value in (("root_id", root_id), ("parent_id", parent_id), ("thread_id", thread_id)):
        if value:
            message[name] = value
    sent_by = {
        "sender_id": {"union_id": f"on_{sender}", "user_id": f"u_{sender}", "open_id": sender},
        "sender_type": sender_type,
        "tenant_key": TENANT_KEY,
    }
    event = {"sender": sent_by, "message": message}
    return _envelope(n, event_type, event, token=token, create_time=now_ms, event_id=event_id)


def text_event(text: str, **kw: Any) -> dict[str, Any]:
    return message_event("text", {"text": text}, **kw)


def bot_mention(key: str = "@_user_1", open_id: str = BOT_OPEN_ID, name: str = "chatgate") -> dict[str, Any]:
    return {
        "key": key,
        "id": {"union_id": f"on_{open_id}", "user_id": "", "open_id": open_id},
        "name": name,
        "tenant_key": TENANT_KEY,
    }


def group_mention(text: str, **kw: Any) -> dict[str, Any]:
    """A group message "@chatgate <text>"."""
    kw.setdefault("chat_id", "oc_team")
    return text_event(f"@_user_1 {text}", chat_type="group", mentions=[bot_mention()], **kw)


def recall_event(
    message_id: str, *, chat_id: str = "oc_alice", token: str = VERIFICATION_TOKEN
) -> dict[str, Any]:
    """`im.message.recalled_v1`: the message was recalled (Feishu names no author)."""
    n = next(_ids)
    now_ms = str(int(time.time() * 1000))
    event = {
        "message_id": message_id,
        "chat_id": chat_id,
        "recall_time": now_ms,
        "recall_type": "message_owner",
    }
    return _envelope(n, "im.message.recalled_v1", event, token=token, create_time=now_ms)


def card_action_event(
    value: dict[str, Any],
    *,
    operator: str,
    message_id: str,
    chat_id: str = "oc_alice",
    token: str = VERIFICATION_TOKEN,
) -> dict[str, Any]:
    """`card.action.trigger`: `operator` pressed a button whose `value` is `value` on the card
    message `message_id` (the callback format of Feishu's card JSON 2.0 / new callbacks)."""
    n = next(_ids)
    now_us = str(int(time.time() * 1_000_000))
    return _envelope(
        n,
        "card.action.trigger",
        {
            "operator": {
                "tenant_key": TENANT_KEY,
                "user_id": f"u_{operator}",
                "open_id": operator,
                "union_id": f"on_{operator}",
            },
            "token": f"c-{n:08x}",
            "action": {"value": value, "tag": "button"},
            "host": "im_message",
            "context": {"open_message_id": message_id, "open_chat_id": chat_id},
        },
        token=token,
        create_time=now_us,
    )


def reaction_event(
    message_id: str,
    emoji_type: str,
    *,
    operator: str = "ou_alice",
    removed: bool = False,
    operator_type: str = "user",
    token: str = VERIFICATION_TOKEN,
) -> dict[str, Any]:
    """`im.message.reaction.created_v1` (or `deleted_v1`): `operator` added (took back) the
    reaction `emoji_type` on `message_id`. Feishu names the message, not its chat."""
    n = next(_ids)
    now_ms = str(int(time.time() * 1000))
    event: dict[str, Any] = {
        "message_id": message_id,
        "reaction_type": {"emoji_type": emoji_type},
        "operator_type": operator_type,
        "action_time": now_ms,
    }
    if operator_type == "user":
        event["user_id"] = {"union_id": f"on_{operator}", "user_id": f"u_{operator}", "open_id": operator}
    else:
        event["app_id"] = operator
    kind = "deleted" if removed else "created"
    return _envelope(n, f"im.message.reaction.{kind}_v1", event, token=token, create_time=now_ms)
