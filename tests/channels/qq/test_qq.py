"""QQ official bot webhook end to end, against a fake QQ platform (token endpoint + OpenAPI)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from typing import Any
from urllib.parse import quote

import httpx
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from sqlalchemy import select

from app.db.models import inbox, outbox
from app.events import ImagePart, OutboundMessage, TextPart
from channels.qq import QQSettings
from tests.channels.support import LOCAL_MEDIA, count, session_messages
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.fakes.media_server import FakeMediaServer
from tests.fakes.qq import QQPlatform, c2c_message, group_at_message, key_from_secret, signed_headers
from tests.support.timing import scaled

APP_ID = "102000001"
SECRET = "naOC0ocQE3shWLAfffVLB1rhYPG7"


def qq_settings(platform: QQPlatform | None = None, **overrides: Any) -> QQSettings:
    values: dict[str, Any] = {"app_id": APP_ID, "app_secret": SECRET}
    if platform is not None:
        values.update(api_base_url=platform.url, token_url=platform.token_url)
    values.update(overrides)
    return QQSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def _post(
    client: httpx.AsyncClient, srv: Any, payload: dict[str, Any], *, secret: str = SECRET, **kw: Any
) -> httpx.Response:
    body = json.dumps(payload).encode()
    return await client.post(
        f"{srv.url}/channels/qq", content=body, headers=signed_headers(secret, body, app_id=APP_ID, **kw)
    )


async def _wait_for_outbox(runtime: Any, status: str) -> None:
    deadline = time.monotonic() + scaled(15)
    while await count(runtime, outbox, outbox.c.status == status) == 0:
        assert time.monotonic() < deadline, f"no outbox row became {status}"
        await asyncio.sleep(0.05)


async def _user_texts(client: httpx.AsyncClient, srv: Any, key: str) -> list[str]:
    return [m["content"] for m in await session_messages(client, srv.url, key) if m["role"] == "user"]


def test_the_test_signer_derives_the_published_key_pair() -> None:
    """The docs' own example (secret → public key), so the fake signs as the platform does."""
    key = key_from_secret("naOC0ocQE3shWLAfffVLB1rhYPG7")
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert list(public) == [
        215, 195, 98, 254, 120, 174, 248, 31, 242, 50, 135, 180, 147, 98, 139, 93,
        176, 42, 60, 79, 227, 11, 33, 94, 77, 25, 96, 155, 93, 118, 103, 58,
    ]  # fmt: skip


async def test_callback_validation_is_answered_with_the_documented_signature(serve: ServeApp) -> None:
    settings = qq_settings(app_id="11111111", app_secret="DG5g3B4j9X2KOErG")
    payload = {"d": {"plain_token": "Arq0D5A61EgUu4OxUvOp", "event_ts": "1725442341"}, "op": 13}
    expected = (
        "87befc99c42c651b3aac0278e71ada338433ae26fcb24307bdc5ad38c1adc2d0"
        "1bcfcadc0842edac85e85205028a1132afe09280305f13aa6909ffc2d652c706"
    )
    async with serve(channel_settings={"qq": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
        # As the docs show it: no signature headers on the validation request.
        resp = await client.post(
            f"{srv.url}/channels/qq",
            json=payload,
            headers={"User-Agent": "QQBot-Callback", "X-Bot-Appid": "11111111"},
        )
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"plain_token": "Arq0D5A61EgUu4OxUvOp", "signature": expected}
        # A signed validation is answered the same way.
        body = json.dumps(payload).encode()
        signed = await client.post(
            f"{srv.url}/channels/qq", content=body, headers=signed_headers("DG5g3B4j9X2KOErG", body)
        )
        assert signed.json()["signature"] == expected


async def test_private_message_is_answered_passively_through_the_openapi(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = c2c_message("OPENID_A", "hello", message_id="MSG-1")
            resp = await _post(client, srv, event)
            assert resp.status_code == 200, resp.text
            assert resp.json()["op"] == 12
            [sent] = await platform.wait_for(1)
            assert sent.path == "/v2/users/OPENID_A/messages"
            assert sent.authorization == "QQBot token-1"
            seq = sent.body.pop("msg_seq")
            assert sent.body == {"content": "You said: hello", "msg_type": 0, "msg_id": "MSG-1"}
            assert isinstance(seq, int) and seq > 0
            assert await _user_texts(client, srv, "qq:user%3AOPENID_A") == ["hello"]
            # A second message reuses the cached access token.
            await _post(client, srv, c2c_message("OPENID_A", "again", message_id="MSG-2"))
            await platform.wait_for(2)
            assert platform.token_requests == 1


async def test_group_at_messages_give_each_member_a_session_with_user_in_chat(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        settings = qq_settings(platform, session_scope="user_in_chat")
        async with serve(channel_settings={"qq": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            await _post(client, srv, group_at_message("GROUP_1", "MEMBER_A", " I like tea"))
            await _post(client, srv, group_at_message("GROUP_1", "MEMBER_B", " I like coffee"))
            sent = await platform.wait_for(2)
            assert {s.path for s in sent} == {"/v2/groups/GROUP_1/messages"}
            assert sorted(s.body["content"] for s in sent) == [
                "You said: I like coffee",
                "You said: I like tea",
            ]
            assert await _user_texts(client, srv, "qq:group%3AGROUP_1:user:MEMBER_A") == ["I like tea"]
            assert await _user_texts(client, srv, "qq:group%3AGROUP_1:user:MEMBER_B") == ["I like coffee"]


async def test_a_long_reply_is_split_with_growing_msg_seq(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        settings = qq_settings(platform, max_text_chars=20)
        async with serve(channel_settings={"qq": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            text = "abcdefghij" * 4
            await _post(client, srv, c2c_message("OPENID_A", text, message_id="MSG-9"))
            await _wait_for_outbox(srv.runtime, "sent")
            sent = platform.sent
            assert "".join(s.body["content"] for s in sent) == f"You said: {text}"
            first = sent[0].body["msg_seq"]
            assert [s.body["msg_seq"] for s in sent] == list(range(first, first + len(sent)))
            assert {s.body["msg_id"] for s in sent} == {"MSG-9"}


async def test_a_retried_split_reply_is_neither_lost_nor_shown_twice(serve: ServeApp) -> None:
    """Chunk 2 fails outright, chunk 3 gets through but its answer is lost: the retries
    send only what is missing, and the platform's duplicate refusal counts as delivered."""
    async with QQPlatform(APP_ID, SECRET, fail_at=frozenset({2}), lose_answer_at=frozenset({4})) as platform:
        settings = qq_settings(platform, max_text_chars=20)
        async with serve(channel_settings={"qq": settings}) as srv, httpx.AsyncClient(timeout=30) as client:
            text = "abcdefghij" * 4  # the reply "You said: …" is 3 chunks of at most 20
            await _post(client, srv, c2c_message("OPENID_A", text, message_id="MSG-R"))
            await _wait_for_outbox(srv.runtime, "sent")
            contents = [s.body["content"] for s in platform.sent]
            assert "".join(contents) == f"You said: {text}"
            first = platform.sent[0].body["msg_seq"]
            assert [s.body["msg_seq"] for s in platform.sent] == [first, first + 1, first + 2]
            # attempts: 1 ok, 2 500, 3 ok (chunk 2), 4 accepted + 500 (chunk 3), 5 duplicate
            assert platform.message_attempts == 5
            async with srv.runtime.engine.connect() as conn:
                attempts = (await conn.execute(select(outbox.c.attempts))).scalar_one()
            assert attempts == 3


async def test_images_arrive_as_parts_and_leave_as_uploaded_rich_media(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform, FakeMediaServer() as cdn:
        cdn.files["cat.jpg"] = (b"\xff\xd8 a cat", "image/jpeg")
        async with (
            serve(**LOCAL_MEDIA, channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            picture = {
                "content_type": "image/jpeg",
                "filename": "cat.jpg",
                "url": cdn.url_of("cat.jpg"),
                "size": 1234,
            }
            event = c2c_message("OPENID_A", "look", message_id="MSG-IMG", attachments=[picture])
            assert (await _post(client, srv, event)).status_code == 200
            await platform.wait_for(1)
            resp = await client.get(
                f"{srv.url}/admin/api/sessions/{quote('qq:user%3AOPENID_A', safe='')}/messages",
                headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
            )
            [user] = [m for m in resp.json()["messages"] if m["role"] == "user"]
            assert user["parts"][0]["type"] == "image"
            assert base64.b64decode(user["parts"][0]["data_base64"]) == b"\xff\xd8 a cat"  # downloaded
            # An answer with an image (sent through the real adapter against the fake).
            adapter = srv.runtime.adapters["qq"]
            answer = OutboundMessage(
                channel="qq",
                chat_id="user:OPENID_A",
                parts=(TextPart(text="here"), ImagePart(url="https://img.example/dog.png")),
                metadata={"reply_msg_id": "MSG-IMG"},
            )
            result = await adapter.send(answer)
            assert result.platform_message_id == "sent-3"
            [upload] = platform.uploads
            assert upload.path == "/v2/users/OPENID_A/files"
            assert upload.body == {
                "file_type": 1,
                "url": "https://img.example/dog.png",
                "srv_send_msg": False,
            }
            text, media = platform.sent[1:]
            first = platform.sent[0].body["msg_seq"]
            assert text.body == {"content": "here", "msg_type": 0, "msg_id": "MSG-IMG", "msg_seq": first + 1}
            assert media.body == {
                "msg_type": 7,
                "media": {"file_info": "file-info-1"},
                "msg_id": "MSG-IMG",
                "msg_seq": first + 2,
            }


async def test_forged_stale_and_unsigned_callbacks_are_refused(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            url = f"{srv.url}/channels/qq"
            event = c2c_message("OPENID_A", "forged")
            body = json.dumps(event).encode()
            cases: list[tuple[str, bytes, dict[str, str]]] = [
                ("unsigned", body, {"Content-Type": "application/json"}),
                ("wrong secret", body, signed_headers("some-other-secret", body)),
                ("tampered", body.replace(b"forged", b"FORGED"), signed_headers(SECRET, body)),
                ("stale", body, signed_headers(SECRET, body, timestamp=int(time.time()) - 3600)),
                ("other bot", body, signed_headers(SECRET, body, app_id="999")),
                ("not hex", body, {**signed_headers(SECRET, body), "X-Signature-Ed25519": "zz"}),
            ]
            # An unsigned validation whose token would make us sign a callback body.
            oracle = {"op": 13, "d": {"plain_token": json.dumps(event), "event_ts": "1700000000"}}
            cases.append(
                ("signing oracle", json.dumps(oracle).encode(), {"Content-Type": "application/json"})
            )
            for reason, content, headers in cases:
                resp = await client.post(url, content=content, headers=headers)
                assert resp.status_code == 401, (reason, resp.status_code, resp.text)
                assert resp.json()["detail"], reason
            assert await count(srv.runtime, inbox) == 0
            ok = await _post(client, srv, event)
            assert ok.status_code == 200


async def test_a_redelivered_callback_is_processed_once(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            event = c2c_message("OPENID_A", "once", message_id="MSG-ONCE")
            for _ in range(3):
                assert (await _post(client, srv, event)).status_code == 200
            await platform.wait_for(1)
            # A later message from the same person is the barrier: a duplicated answer to the
            # redelivered one would be sent before the barrier's.
            barrier = c2c_message("OPENID_A", "barrier", message_id="MSG-BARRIER")
            assert (await _post(client, srv, barrier)).status_code == 200
            sent = await platform.wait_for(2)
            assert ["barrier" in str(m.body) for m in sent] == [False, True]
            assert await count(srv.runtime, inbox) == 2


async def test_an_openapi_outage_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET, fail_first=-1) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}, outbox_max_attempts=3) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, c2c_message("OPENID_A", "hello"))
            await _wait_for_outbox(srv.runtime, "failed")
            assert platform.message_attempts == 3
            async with srv.runtime.engine.connect() as conn:
                error = (await conn.execute(select(outbox.c.last_error))).scalar_one()
            assert "500" in error


async def test_a_revoked_token_is_replaced_and_bad_credentials_fail_without_retries(serve: ServeApp) -> None:
    async with QQPlatform(APP_ID, SECRET) as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, c2c_message("OPENID_A", "one"))
            await platform.wait_for(1)
            platform.revoke_tokens()
            await _post(client, srv, c2c_message("OPENID_A", "two"))
            [_, second] = await platform.wait_for(2)
            assert second.authorization == "QQBot token-2"
            assert platform.token_requests == 2
    # The platform does not know our secret: a send auth error, not retried.
    async with QQPlatform(APP_ID, "the-real-secret") as platform:
        async with (
            serve(channel_settings={"qq": qq_settings(platform)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, c2c_message("OPENID_A", "hello"))
            await _wait_for_outbox(srv.runtime, "failed")
            async with srv.runtime.engine.connect() as conn:
                query = select(outbox.c.attempts, outbox.c.last_error).where(outbox.c.status == "failed")
                row = (await conn.execute(query)).one()
            assert row.attempts == 1
            assert "invalid appid or secret" in row.last_error


async def test_without_credentials_the_channel_answers_503(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"qq": qq_settings(app_secret=None)}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        resp = await _post(client, srv, c2c_message("OPENID_A", "hello"))
        assert resp.status_code == 503
        assert "QQ_APP_SECRET" in resp.json()["detail"]
