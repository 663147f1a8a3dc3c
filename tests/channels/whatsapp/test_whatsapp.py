"""WhatsApp Cloud API webhook end to end, against a fake Graph API; signatures made here."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from typing import Any

import httpx
from sqlalchemy import select

from app.db.models import channel_records, inbox
from app.errors import ChannelRateLimited
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.probe import CredentialsRejected
from channels.whatsapp import WhatsAppSettings
from channels.whatsapp.adapter import WhatsAppChannel
from channels.whatsapp.probe import probe
from tests.channels.support import (
    count,
    llm_settings,
    outbox_rows,
    send_only_context,
    session_messages,
    settled_outbox,
)
from tests.conftest import ServeApp
from tests.fakes.openai_server import FakeOpenAI, Reply
from tests.fakes.whatsapp import GraphAPI, image_message, signed_headers, status_update, text_message

SECRET = "app-secret-0123456789abcdef"
VERIFY = "my-verify-token"
TOKEN = "EAAG-test-token"
PHONE = "106540352242922"
USER = "15551234567"
KEY = f"whatsapp:{USER}"


def wa_settings(graph: GraphAPI | None = None, **overrides: Any) -> WhatsAppSettings:
    values: dict[str, Any] = {
        "app_secret": SECRET,
        "verify_token": VERIFY,
        "access_token": TOKEN,
        "phone_number_id": PHONE,
    }
    if graph is not None:
        values["graph_base_url"] = graph.url
    values.update(overrides)
    return WhatsAppSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def _post(client: httpx.AsyncClient, srv: Any, payload: dict[str, Any]) -> httpx.Response:
    body = json.dumps(payload).encode()
    return await client.post(
        f"{srv.url}/channels/whatsapp", content=body, headers=signed_headers(SECRET, body)
    )


async def _user_texts(client: httpx.AsyncClient, srv: Any, key: str = KEY) -> list[Any]:
    return [m["content"] for m in await session_messages(client, srv.url, key) if m["role"] == "user"]


def test_the_test_signer_follows_the_published_rule() -> None:
    """sha256= and the hex HMAC-SHA256 of the raw body under the app secret."""
    body = b'{"object":"whatsapp_business_account"}'
    expected = hmac.new(b"app-secret-0123456789abcdef", body, hashlib.sha256).hexdigest()
    assert signed_headers(SECRET, body)["X-Hub-Signature-256"] == "sha256=" + expected
    assert len(expected) == 64


async def test_the_verification_handshake_echoes_the_challenge(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"whatsapp": wa_settings()}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        url = f"{srv.url}/channels/whatsapp"
        ok = await client.get(
            url, params={"hub.mode": "subscribe", "hub.verify_token": VERIFY, "hub.challenge": "1158201444"}
        )
        assert ok.status_code == 200, ok.text
        assert ok.text == "1158201444"
        wrong = await client.get(
            url, params={"hub.mode": "subscribe", "hub.verify_token": "guess", "hub.challenge": "1"}
        )
        assert wrong.status_code == 403
        assert "1" != wrong.text
        other_mode = await client.get(
            url, params={"hub.mode": "unsubscribe", "hub.verify_token": VERIFY, "hub.challenge": "2"}
        )
        assert other_mode.status_code == 403


async def test_a_text_is_answered_through_the_graph_api(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            resp = await _post(client, srv, text_message(PHONE, USER, "hello", message_id="wamid.A1"))
            assert resp.status_code == 200, resp.text
            [sent] = await graph.wait_for(1)
            assert sent.body == {
                "messaging_product": "whatsapp",
                "recipient_type": "individual",
                "to": USER,
                "type": "text",
                "text": {"body": "You said: hello"},
            }
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "sent"
            rows = await outbox_rows(srv.runtime)
            assert rows[0]["platform_message_id"] == "wamid.OUT1"
            assert await _user_texts(client, srv) == ["hello"]


async def test_the_typing_indicator_shows_while_the_turn_runs(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with GraphAPI(TOKEN, PHONE) as graph, FakeOpenAI(default=Reply(content="Done.", hold=hold)) as llm:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}, **llm_settings(llm)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, text_message(PHONE, USER, "think hard", message_id="wamid.T1"))
            [mark] = await graph.wait_for_read(1)
            assert mark == {
                "messaging_product": "whatsapp",
                "status": "read",
                "message_id": "wamid.T1",
                "typing_indicator": {"type": "text"},
            }
            assert graph.sent == []  # the model has not answered yet
            hold.set()
            [sent] = await graph.wait_for(1)
            assert sent.body["text"]["body"] == "Done."


async def test_with_streaming_off_there_is_no_typing_indicator() -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        off = WhatsAppChannel(wa_settings(streaming="off"), send_only_context(http))
        assert off.streamer() is None  # the preview hub then never asks for typing
        noticed = WhatsAppChannel(
            wa_settings(streaming="off", working_notice_seconds=5), send_only_context(http)
        ).streamer()
        assert noticed is not None
        assert noticed._show_typing is None  # only the working notice


async def test_a_bad_signature_is_refused_and_nothing_stored(serve: ServeApp) -> None:
    async with (
        serve(channel_settings={"whatsapp": wa_settings()}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        body = json.dumps(text_message(PHONE, USER, "forged")).encode()
        url = f"{srv.url}/channels/whatsapp"
        forged = await client.post(url, content=body, headers=signed_headers("another-secret", body))
        assert forged.status_code == 401
        unsigned = await client.post(url, content=body, headers={"Content-Type": "application/json"})
        assert unsigned.status_code == 401
        # Signed, then changed: the signature covers the raw body.
        headers = signed_headers(SECRET, body)
        tampered = await client.post(url, content=body.replace(b"forged", b"Forged"), headers=headers)
        assert tampered.status_code == 401
        assert await count(srv.runtime, inbox) == 0
        assert await count(srv.runtime, channel_records) == 0


async def test_a_redelivered_message_is_answered_once(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            payload = text_message(PHONE, USER, "once", message_id="wamid.SAME")
            for _ in range(3):
                assert (await _post(client, srv, payload)).status_code == 200
            await graph.wait_for(1)
            await settled_outbox(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert [s.body["text"]["body"] for s in graph.sent] == ["You said: once"]
            assert await _user_texts(client, srv) == ["once"]


async def test_statuses_are_recorded_and_failed_fails_the_outbox_row(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, text_message(PHONE, USER, "hi"))
            [sent] = await graph.wait_for(1)
            await settled_outbox(srv.runtime)
            read = status_update(PHONE, sent.wamid, "read", USER)
            assert (await _post(client, srv, read)).status_code == 200
            async with srv.runtime.engine.connect() as conn:
                receipt = (
                    await conn.execute(
                        select(channel_records.c.data).where(
                            channel_records.c.channel == "whatsapp", channel_records.c.kind == "receipt"
                        )
                    )
                ).scalar_one()
            assert receipt["message_id"] == sent.wamid and receipt["status"] == "read"
            assert (await outbox_rows(srv.runtime))[0]["status"] == "sent"
            error = {
                "code": 131026,
                "title": "Message undeliverable",
                "error_data": {"details": "Unable to deliver message."},
            }
            failed = status_update(PHONE, sent.wamid, "failed", USER, error=error)
            assert (await _post(client, srv, failed)).status_code == 200
            [row] = await outbox_rows(srv.runtime)
            assert row["status"] == "failed"
            assert "131026" in row["last_error"] and "Unable to deliver message." in row["last_error"]


async def test_outside_the_window_the_template_is_sent_and_the_answer_is_not(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        settings = wa_settings(graph, template_name="hello_world", template_language="en_US")
        async with (
            serve(channel_settings={"whatsapp": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # A message delivered late (Meta retries for days): its user wrote 25 hours ago.
            late = text_message(PHONE, USER, "still there?", timestamp=time.time() - 25 * 3600)
            assert (await _post(client, srv, late)).status_code == 200
            [sent] = await graph.wait_for(1)
            assert sent.body["type"] == "template"
            assert sent.body["template"] == {"name": "hello_world", "language": {"code": "en_US"}}
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "failed"
            assert "24-hour customer-service window" in row.last_error
            assert "template 'hello_world' sent instead" in row.last_error
            assert "the answer was not sent" in row.last_error
            assert await _user_texts(client, srv) == ["still there?"]


async def test_outside_the_window_without_a_template_nothing_is_sent(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            late = text_message(PHONE, USER, "hello?", timestamp=time.time() - 30 * 3600)
            await _post(client, srv, late)
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "failed"
            assert "customer-service window" in row.last_error and "WHATSAPP_TEMPLATE_NAME" in row.last_error
            assert graph.message_attempts == 0


async def test_the_platforms_own_window_refusal_falls_back_to_the_template(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        graph.closed.add(USER)  # the platform's clock says the window closed; ours does not know
        settings = wa_settings(graph, template_name="reopen")
        async with (
            serve(channel_settings={"whatsapp": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, text_message(PHONE, USER, "hi"))
            [sent] = await graph.wait_for(1)
            assert sent.body["type"] == "template" and sent.body["template"]["name"] == "reopen"
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "failed" and "131047" in row.last_error


async def test_an_image_is_downloaded_by_media_id(serve: ServeApp) -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
    async with GraphAPI(TOKEN, PHONE) as graph:
        graph.media["MEDIA-1"] = (png, "image/png")
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, image_message(PHONE, USER, "MEDIA-1", caption="what is this?"))
            await graph.wait_for(1)
            assert graph.media_lookups == ["MEDIA-1"] and graph.downloads == ["MEDIA-1"]
            async with srv.runtime.engine.connect() as conn:
                stored = (await conn.execute(select(inbox.c.payload))).scalar_one()
            image = next(p for p in stored["parts"] if p["type"] == "image")
            assert base64.b64decode(image["data_base64"]) == png
            assert image["mime_type"] == "image/png"
            assert any(p.get("text") == "what is this?" for p in stored["parts"])


async def test_an_image_over_the_cap_is_refused_politely_and_not_stored(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        graph.media["BIG"] = (b"x" * 5000, "image/jpeg")
        settings = wa_settings(graph, media_max_bytes=1000)
        async with (
            serve(channel_settings={"whatsapp": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            assert (await _post(client, srv, image_message(PHONE, USER, "BIG"))).status_code == 200
            [sent] = await graph.wait_for(1)
            assert "too large" in sent.body["text"]["body"]
            assert graph.downloads == []  # refused on the declared file_size
            assert await count(srv.runtime, inbox) == 0


async def test_a_long_answer_is_split_at_4096_characters(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            text = " ".join(f"word{i}" for i in range(1500))  # 12,389 characters
            await _post(client, srv, text_message(PHONE, USER, text))
            await settled_outbox(srv.runtime)
            bodies = [s.body["text"]["body"] for s in graph.sent]
            assert len(f"You said: {text}") == 12_399
            assert len(bodies) == 4  # cut at word breaks, each chunk close to the limit
            assert all(4000 < len(b) <= 4096 for b in bodies[:-1])
            assert "".join(bodies) == f"You said: {text}"


async def test_a_retry_after_a_partial_send_sends_only_the_rest(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE, fail_at=frozenset({2})) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            text = " ".join(f"word{i}" for i in range(1000))  # 7,889 characters: two messages
            await _post(client, srv, text_message(PHONE, USER, text))
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "sent" and row.attempts == 2
            bodies = [s.body["text"]["body"] for s in graph.sent]
            assert len(bodies) == 2  # the first chunk was not sent again
            assert "".join(bodies) == f"You said: {text}"
            assert (await outbox_rows(srv.runtime))[0]["platform_message_id"] == "wamid.OUT2"


async def test_server_errors_are_retried_by_the_outbox(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE, fail_first=2) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, text_message(PHONE, USER, "retry me"))
            await graph.wait_for(1)
            [row] = await settled_outbox(srv.runtime)
            assert row.status == "sent" and row.attempts == 3
            assert graph.message_attempts == 3


async def test_a_group_message_that_mentions_the_number_is_answered_in_the_group(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        async with (
            serve(channel_settings={"whatsapp": wa_settings(graph)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            # Not addressed to the bot: ignored, nothing stored (WHATSAPP_REQUIRE_MENTION_IN_GROUPS).
            await _post(client, srv, text_message(PHONE, USER, "chatting among us", group_id="G-77"))
            assert await count(srv.runtime, inbox) == 0
            await _post(client, srv, text_message(PHONE, USER, "@15550001111 hi all", group_id="G-77"))
            [sent] = await graph.wait_for(1)
            assert sent.body["recipient_type"] == "group" and sent.body["to"] == "G-77"
            assert await _user_texts(client, srv, "whatsapp:group%3AG-77") == ["@15550001111 hi all"]


async def test_without_the_mention_rule_every_group_message_is_taken(serve: ServeApp) -> None:
    async with GraphAPI(TOKEN, PHONE) as graph:
        settings = wa_settings(graph, require_mention_in_groups=False, session_scope="user_in_chat")
        async with (
            serve(channel_settings={"whatsapp": settings}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await _post(client, srv, text_message(PHONE, USER, "hi all", group_id="G-77"))
            [sent] = await graph.wait_for(1)
            assert sent.body["to"] == "G-77"
            key = f"whatsapp:group%3AG-77:user:{USER}"
            assert await _user_texts(client, srv, key) == ["hi all"]


async def test_the_doctor_probe_reads_the_phone_number() -> None:
    async with GraphAPI(TOKEN, PHONE) as graph, httpx.AsyncClient(timeout=30) as client:
        assert "+1 555-000-1111" in await probe(wa_settings(graph), client)
        try:
            await probe(wa_settings(graph, access_token="wrong"), client)
        except CredentialsRejected as exc:
            assert "401" in str(exc)
        else:
            raise AssertionError("a wrong token was accepted")


async def test_answer_images_are_uploaded_and_files_sent_as_links() -> None:
    png = b"\x89PNG\r\n\x1a\n" + b"\x01" * 32
    async with GraphAPI(TOKEN, PHONE) as graph, httpx.AsyncClient(timeout=30) as http:
        channel = WhatsAppChannel(wa_settings(graph), send_only_context(http))
        message = OutboundMessage(
            channel="whatsapp",
            chat_id=USER,
            parts=(
                TextPart(text="here"),
                ImagePart(data_base64=base64.b64encode(png).decode(), mime_type="image/png"),
                FilePart(url="https://example.org/report.pdf", name="report.pdf"),
            ),
        )
        result = await channel.send(message)
        assert graph.uploads == [("image/png", png, "image/png")]
        assert [s.body["type"] for s in graph.sent] == ["text", "image", "document"]
        assert graph.sent[1].body["image"] == {"id": "UPLOADED-1"}
        assert graph.sent[2].body["document"] == {
            "link": "https://example.org/report.pdf",
            "filename": "report.pdf",
        }
        assert result.platform_message_id == "wamid.OUT3"


async def test_throttling_is_a_rate_limit_for_the_outbox() -> None:
    async with GraphAPI(TOKEN, PHONE, throttle_first=1) as graph, httpx.AsyncClient(timeout=30) as http:
        channel = WhatsAppChannel(wa_settings(graph), send_only_context(http))
        message = OutboundMessage(channel="whatsapp", chat_id=USER, parts=(TextPart(text="hi"),))
        try:
            await channel.send(message)
        except ChannelRateLimited as exc:
            assert "130429" in exc.detail and exc.retry_after > 0
        else:
            raise AssertionError("a 429 was taken for a delivery")
        assert (await channel.send(message)).platform_message_id == "wamid.OUT1"
