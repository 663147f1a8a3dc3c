"""Feishu's crypto against the official SDK (lark-oapi) as the oracle.

- Feishu's documented decryption example decrypts with our code as with lark-oapi.
- `sdk_vectors.json` (written by `scripts/feishu_sdk_vectors.py`, every vector accepted
  and parsed by lark-oapi's `EventDispatcherHandler`) is accepted by the running app and
  lands with what the SDK parsed.
- The callbacks the test fake builds are accepted by lark-oapi, and what lark-oapi
  refuses our adapter refuses too, so the end-to-end tests speak Feishu's protocol.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from sqlalchemy import select

from app.db.models import inbox
from app.errors import ChannelAuthError
from channels.feishu import crypto
from tests.channels.feishu.support import LARK_OAPI, feishu_settings
from tests.channels.support import wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu

if TYPE_CHECKING:
    from lark_oapi.api.im.v1 import P2ImMessageReceiveV1

VECTORS: list[dict[str, Any]] = json.loads((Path(__file__).parent / "sdk_vectors.json").read_text())[
    "vectors"
]
BOT = "ou_bot_5ce6d572455d"  # the bot the vectors' group message mentions


def sdk_accepts(body: bytes, headers: dict[str, str], key: str, token: str) -> list[P2ImMessageReceiveV1]:
    """The events lark-oapi's dispatcher delivers for this request (none: it refused it)."""
    import lark_oapi as lark

    got: list[P2ImMessageReceiveV1] = []
    handler = (
        lark.EventDispatcherHandler.builder(key, token).register_p2_im_message_receive_v1(got.append).build()
    )
    request = lark.RawRequest()
    request.uri = "/channels/feishu"
    request.headers = headers
    request.body = body
    response = handler.do(request)
    assert (response.status_code == 200) == bool(got)
    return got


@LARK_OAPI
def test_feishus_documented_example_decrypts() -> None:
    from lark_oapi.core.utils import AESCipher

    # From Feishu's event subscription guide: Encrypt Key "test key".
    encrypted = "P37w+VZImNgPEO1RBhJ6RtKl7n6zymIbEG1pReEzghk="
    assert AESCipher("test key").decrypt_str(encrypted) == "hello world"
    assert crypto.decrypt("test key", encrypted) == b"hello world"
    with pytest.raises(ChannelAuthError):
        crypto.decrypt("other key", encrypted)


@LARK_OAPI
@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_sdk_vectors_verify_and_decrypt(vector: dict[str, Any]) -> None:
    body = vector["body"].encode()
    headers = {k.lower(): v for k, v in vector["headers"].items()}
    when = int(vector["headers"]["X-Lark-Request-Timestamp"])
    assert sdk_accepts(body, vector["headers"], vector["encrypt_key"], vector["verification_token"])
    crypto.verify_signature(vector["encrypt_key"], headers, body, now=when + 299)
    with pytest.raises(ChannelAuthError, match="away from server time"):
        crypto.verify_signature(vector["encrypt_key"], headers, body, now=when + 301)
    with pytest.raises(ChannelAuthError, match="does not match"):
        crypto.verify_signature("other key", headers, body, now=when)
    with pytest.raises(ChannelAuthError, match="does not match"):
        crypto.verify_signature(vector["encrypt_key"], headers, body + b" ", now=when)
    plain = json.loads(crypto.decrypt(vector["encrypt_key"], json.loads(body)["encrypt"]))
    assert plain["header"]["event_id"] == vector["sdk"]["event_id"]
    assert plain["event"]["message"]["content"] == vector["sdk"]["content"]


async def test_sdk_vectors_are_accepted_by_the_app(serve: ServeApp) -> None:
    first = VECTORS[0]
    async with FakeFeishu() as fake:
        settings = feishu_settings(
            fake,
            encrypt_key=first["encrypt_key"],
            verification_token=first["verification_token"],
            bot_open_id=BOT,
            session_scope="thread",
            timestamp_tolerance_seconds=0,  # the vectors carry a fixed time
        )
        async with (
            serve(channel_settings={"feishu": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            for vector in VECTORS:
                resp = await client.post(
                    f"{srv.url}/channels/feishu",
                    content=vector["body"].encode(),
                    headers={"Content-Type": "application/json; charset=utf-8", **vector["headers"]},
                )
                assert resp.status_code == 200, (vector["name"], resp.text)
                assert "ignored" not in resp.json(), vector["name"]
            await wait_outbox_final(srv.runtime, len(VECTORS))
            async with srv.runtime.engine.connect() as conn:
                rows = {
                    r.external_id: r
                    for r in await conn.execute(
                        select(inbox.c.external_id, inbox.c.session_key, inbox.c.payload)
                    )
                }
    by_name = {v["name"]: v["sdk"] for v in VECTORS}
    assert set(rows) == {sdk["event_id"] for sdk in by_name.values()}
    text = rows[by_name["p2p text"]["event_id"]]
    assert text.session_key == f"feishu:{by_name['p2p text']['chat_id']}"
    assert text.payload["sender_id"] == by_name["p2p text"]["open_id"]
    assert [p["text"] for p in text.payload["parts"]] == ["你好 hello"]
    group = by_name["group mention in a thread"]
    grouped = rows[group["event_id"]]
    assert grouped.session_key == f"feishu:{group['chat_id']}:{group['root_id']}"
    assert grouped.payload["parts"][0] == {"type": "text", "text": "总结一下"}
    post = rows[by_name["p2p post"]["event_id"]].payload["parts"]
    assert post[0]["text"] == "周报\n完成 文档 (https://example.com/d)"
    assert post[1]["type"] == "image" and post[1]["url"].endswith("/resources/img_v3_0001?type=image")
    image = rows[by_name["p2p image"]["event_id"]].payload["parts"]
    assert [p["type"] for p in image] == ["image"]
    file = rows[by_name["p2p file"]["event_id"]].payload["parts"]
    assert (file[0]["type"], file[0]["name"]) == ("file", "plan.pdf")
    replies = {c.body.get("receive_id") or c.path: c for c in fake.delivered()}
    assert f"/open-apis/im/v1/messages/{group['message_id']}/reply" in replies
    assert replies[f"/open-apis/im/v1/messages/{group['message_id']}/reply"].body["reply_in_thread"] is True


@LARK_OAPI
def test_the_fakes_callbacks_are_what_the_sdk_accepts() -> None:
    event = fs.group_mention("hi", message_id="om_x1")
    body, headers = fs.callback(event)
    [got] = sdk_accepts(body, headers, fs.ENCRYPT_KEY, fs.VERIFICATION_TOKEN)
    assert got.event is not None and got.event.message is not None
    assert got.event.message.message_id == "om_x1"
    assert got.event.message.chat_type == "group"
    lower = {k.lower(): v for k, v in headers.items()}
    crypto.verify_signature(fs.ENCRYPT_KEY, lower, body)
    # What the SDK refuses, the adapter's checks refuse.
    forged_body, forged = fs.callback(event, signing_key="guess")
    assert not sdk_accepts(forged_body, forged, fs.ENCRYPT_KEY, fs.VERIFICATION_TOKEN)
    with pytest.raises(ChannelAuthError):
        crypto.verify_signature(fs.ENCRYPT_KEY, {k.lower(): v for k, v in forged.items()}, forged_body)
    wrong_token_body, wrong_token = fs.callback(fs.text_event("x", token="guess"))
    assert not sdk_accepts(wrong_token_body, wrong_token, fs.ENCRYPT_KEY, fs.VERIFICATION_TOKEN)
