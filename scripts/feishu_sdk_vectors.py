"""Write Feishu callback test vectors that the official SDK (lark-oapi) accepts.

    .venv/bin/python scripts/feishu_sdk_vectors.py > tests/channels/feishu/sdk_vectors.json

Each vector is a callback as Feishu sends it: the body (`{"encrypt": …}`: AES-256-CBC with
key SHA-256(Encrypt Key), the IV in front, PKCS#7, base64) and the headers
`X-Lark-Request-Timestamp`, `X-Lark-Request-Nonce`, `X-Lark-Signature` (hex SHA-256 of
timestamp + nonce + Encrypt Key + body). lark-oapi has no encrypting or signing
function, only the receiving side, so the bodies are built by the published rule with
fixed IVs, nonces and timestamps (the output is reproducible), and every vector is then
handed to lark-oapi's `EventDispatcherHandler`, which decrypts it, checks its signature
and verification token, and parses it into its `P2ImMessageReceiveV1` model. A vector
the SDK refuses stops the script; the fields the SDK parsed are written as the vector's
expected values. `tests/channels/feishu/test_sdk_vectors.py` checks the adapter against
the file, and checks the same way that lark-oapi accepts what the test fake sends.
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from typing import Any

import lark_oapi as lark
from cryptography.hazmat.primitives import padding
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from lark_oapi.api.im.v1 import P2ImMessageReceiveV1

ENCRYPT_KEY = "kudryavka-encrypt-key"
VERIFICATION_TOKEN = "v-token-0001"
TIMESTAMP = "1767225600"  # 2026-01-01T00:00:00Z: the tests give the check a fixed clock


def encrypt(plain: bytes, iv: bytes) -> str:
    padder = padding.PKCS7(128).padder()
    padded = padder.update(plain) + padder.finalize()
    key = hashlib.sha256(ENCRYPT_KEY.encode()).digest()
    encryptor = Cipher(algorithms.AES(key), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(padded) + encryptor.finalize()).decode()


def event(
    n: int, chat_type: str, message_type: str, content: dict[str, Any], **message: Any
) -> dict[str, Any]:
    return {
        "schema": "2.0",
        "header": {
            "event_id": f"5e3702a84e847582be8db7fb73283c{n:02d}",
            "event_type": "im.message.receive_v1",
            "create_time": "1767225600000",
            "token": VERIFICATION_TOKEN,
            "app_id": "cli_9f5343c580712001",
            "tenant_key": "2ca1d211f64f6438",
        },
        "event": {
            "sender": {
                "sender_id": {
                    "union_id": "on_8ed6aa67826108097d9ee143816345",
                    "user_id": "e33ggbyz",
                    "open_id": "ou_84aad35d084aa403a838cf73ee18467",
                },
                "sender_type": "user",
                "tenant_key": "2ca1d211f64f6438",
            },
            "message": {
                "message_id": f"om_5ce6d572455d361153b7cb51da1335{n:02d}",
                "create_time": "1767225600000",
                "chat_id": "oc_5ce6d572455d361153b7xx51da133945",
                "chat_type": chat_type,
                "message_type": message_type,
                "content": json.dumps(content, ensure_ascii=False),
                **message,
            },
        },
    }


CASES: list[tuple[str, dict[str, Any]]] = [
    ("p2p text", event(1, "p2p", "text", {"text": "你好 hello"})),
    (
        "group mention in a thread",
        event(
            2,
            "group",
            "text",
            {"text": "@_user_1 总结一下"},
            root_id="om_5ce6d572455d361153b7cb51da133501",
            parent_id="om_5ce6d572455d361153b7cb51da133501",
            thread_id="omt_1a3b99f8d3c0c001",
            mentions=[
                {
                    "key": "@_user_1",
                    "id": {"union_id": "on_bot", "user_id": "", "open_id": "ou_bot_5ce6d572455d"},
                    "name": "chatgate",
                    "tenant_key": "2ca1d211f64f6438",
                }
            ],
        ),
    ),
    (
        "p2p post",
        event(
            3,
            "p2p",
            "post",
            {
                "title": "周报",
                "content": [
                    [
                        {"tag": "text", "text": "完成 "},
                        {"tag": "a", "text": "文档", "href": "https://example.com/d"},
                    ],
                    [{"tag": "img", "image_key": "img_v3_0001"}],
                ],
            },
        ),
    ),
    ("p2p image", event(4, "p2p", "image", {"image_key": "img_v3_0002"})),
    ("p2p file", event(5, "p2p", "file", {"file_key": "file_v3_0003", "file_name": "plan.pdf"})),
]


def vector(n: int, name: str, payload: dict[str, Any]) -> dict[str, Any]:
    plain = json.dumps(payload, ensure_ascii=False).encode()
    iv = hashlib.sha256(f"iv-{n}".encode()).digest()[:16]
    body = json.dumps({"encrypt": encrypt(plain, iv)}).encode()
    nonce = f"{n:04d}-8d2b1a"
    signature = hashlib.sha256((TIMESTAMP + nonce + ENCRYPT_KEY).encode() + body).hexdigest()
    headers = {
        "X-Lark-Request-Timestamp": TIMESTAMP,
        "X-Lark-Request-Nonce": nonce,
        "X-Lark-Signature": signature,
    }
    parsed: list[P2ImMessageReceiveV1] = []
    handler = (
        lark.EventDispatcherHandler.builder(ENCRYPT_KEY, VERIFICATION_TOKEN)
        .register_p2_im_message_receive_v1(parsed.append)
        .build()
    )
    request = lark.RawRequest()
    request.uri = "/channels/feishu"
    request.headers = headers
    request.body = body
    response = handler.do(request)
    if response.status_code != 200 or len(parsed) != 1:
        sys.exit(f"lark-oapi refused vector {name!r}: {response.status_code} {response.content!r}")
    got = parsed[0]
    assert got.header is not None and got.event is not None and got.event.message is not None
    message = got.event.message
    sender = got.event.sender
    assert sender is not None and sender.sender_id is not None
    return {
        "name": name,
        "encrypt_key": ENCRYPT_KEY,
        "verification_token": VERIFICATION_TOKEN,
        "headers": headers,
        "body": body.decode(),
        "sdk": {
            "event_id": got.header.event_id,
            "message_id": message.message_id,
            "chat_id": message.chat_id,
            "chat_type": message.chat_type,
            "message_type": message.message_type,
            "content": message.content,
            "root_id": message.root_id,
            "thread_id": message.thread_id,
            "open_id": sender.sender_id.open_id,
        },
    }


def main() -> None:
    vectors = [vector(n, name, payload) for n, (name, payload) in enumerate(CASES, start=1)]
    json.dump(
        {"generator": "scripts/feishu_sdk_vectors.py", "vectors": vectors},
        sys.stdout,
        ensure_ascii=False,
        indent=1,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
