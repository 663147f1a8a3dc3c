"""Issue 31's smaller holes, through the real server: a retry over the quota is a duplicate,
the pairing cap holds under 120 newcomers at once, code guessing is rate-limited, the
admin APIs take strict booleans, and no configuration error or page shows a secret."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from app.access import AccessStore
from app.config_view import REDACTED
from app.doctor import format_validation_error
from channels.a2a import A2ASettings
from tests.access.support import MeteredModel
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _post(http: httpx.AsyncClient, url: str, body: dict[str, Any], **kw: Any) -> dict[str, Any]:
    resp = await post_webhook(http, url, WEBHOOK_SECRET, body, **kw)
    assert resp.status_code in (200, 202), resp.text
    data: dict[str, Any] = resp.json()
    return data


async def test_a_retry_over_the_quota_is_answered_as_a_duplicate(serve: ServeApp) -> None:
    model = MeteredModel()
    channel = webhook_settings(quota_sender_messages_per_minute=1)
    async with (
        serve(channel_settings={"webhook": channel}, provider=model) as srv,
        httpx.AsyncClient(timeout=30) as http,
    ):
        first = await _post(
            http, srv.url, {"chat_id": "c", "sender_id": "ann", "text": "one", "message_id": "m1"}, wait=True
        )
        assert first["replies"][0]["text"] == "echo one"
        over = await _post(
            http, srv.url, {"chat_id": "c", "sender_id": "ann", "text": "two", "message_id": "m2"}
        )
        assert over.get("reason") == "quota"
        # The platform retries the first one: over the quota, it is still the same event.
        again = await _post(
            http, srv.url, {"chat_id": "c", "sender_id": "ann", "text": "one", "message_id": "m1"}
        )
        assert again["duplicate"] is True
        assert again["event_id"] == first["event_id"]
        assert "reason" not in again or again["reason"] is None
    assert model.calls == ["one"]  # ran once, and the refused one never


@pytest.mark.alone
@pytest.mark.serial(reason="120 concurrent requests through the server; slow on a shared machine")
async def test_the_pairing_cap_holds_under_120_concurrent_newcomers(serve: ServeApp) -> None:
    channel = webhook_settings(access="pairing", pairing_max_pending=100)
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=120) as http:
        answers = await asyncio.gather(
            *(
                _post(http, srv.url, {"chat_id": f"n{i}", "sender_id": f"n{i}", "text": "hi"})
                for i in range(120)
            )
        )
        assert all(a["reason"] == "pairing" for a in answers)
        told = [a for a in answers if "notice" in a]
        pending = await srv.runtime.access.store.pending("webhook")
        assert len(told) == 100
        assert len(pending) == 100
        assert {p["sender_id"] for p in pending} == {a["session_key"].split(":")[1] for a in told}


async def test_store_level_cap_is_exact_with_racing_replicas(engine: Any) -> None:
    stores = [AccessStore(engine) for _ in range(3)]
    minted = await asyncio.gather(
        *(
            stores[i % 3].request_code("qq", f"s{i}", f"s{i}", "hi", ttl=600, max_pending=50)
            for i in range(120)
        )
    )
    assert len([c for c in minted if c is not None]) == 50


async def test_link_code_guesses_are_limited_per_sender(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as http:

        async def say(sender: str, text: str) -> str:
            body = {"chat_id": f"dm-{sender}", "sender_id": sender, "text": text}
            data = await _post(http, srv.url, body, wait=True)
            return str(data["replies"][0]["text"])

        issued = await say("alice", "/link")
        code = issued.split("link code: ")[1].split()[0]
        for guess in ("AAAAAAAA", "BBBBBBBB", "CCCCCCCC", "DDDDDDDD", "EEEEEEEE"):
            assert "unknown, used or expired" in await say("mallory", f"/link {guess}")
        # The sixth try within the window is refused without looking: even the right code.
        assert "Too many tries" in await say("mallory", f"/link {code}")
        # Another sender is not held back by mallory's tries, and the code still works.
        assert "linked" in (await say("bob", f"/link {code}")).lower()


async def test_pairing_code_requests_are_limited_per_sender(serve: ServeApp) -> None:
    # Codes that expire at once: each message would mint a new one without the limit.
    channel = webhook_settings(access="pairing", pairing_code_ttl_seconds=0.001)
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:
        told = []
        for _ in range(12):
            answer = await _post(http, srv.url, {"chat_id": "dm-x", "sender_id": "x", "text": "hi"})
            told.append("notice" in answer)
            await asyncio.sleep(0.01)  # past the code's millisecond of life
        assert told == [True] * 10 + [False] * 2


async def test_dead_letter_api_takes_only_real_booleans(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
        for value in (1, "true", "yes", 1.0):
            resp = await http.post("/admin/api/dead-letters/discard", json={"all": value}, headers=AUTH)
            assert resp.status_code == 422, (value, resp.text)
        ok = await http.post("/admin/api/dead-letters/discard", json={"all": True}, headers=AUTH)
        assert ok.status_code == 200, ok.text
        # A NUL in a filter is the 422 every admin body gives, not PostgreSQL's 500 (the fuzzer's find).
        for action in ("retry", "discard"):
            bad = await http.post(
                f"/admin/api/dead-letters/{action}", json={"error_contains": "a\x00b"}, headers=AUTH
            )
            assert bad.status_code == 422, bad.text


async def test_secrets_in_callback_query_strings_are_redacted_on_the_config_page(serve: ServeApp) -> None:
    hook = "https://hooks.example/cb?token=query-secret-that-must-not-leak&room=7"
    channel = webhook_settings(callback_url=hook)
    async with (
        serve(channel_settings={"webhook": channel}) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as http,
    ):
        resp = await http.get("/admin/api/config", headers=AUTH)
        assert resp.status_code == 200
        assert "query-secret-that-must-not-leak" not in resp.text
        webhook = {
            r["name"]: r for s in resp.json()["sections"] for r in s["settings"] if s["name"] == "webhook"
        }
        assert webhook["callback_url"]["value"] == f"https://hooks.example/cb?token={REDACTED}&room=7"


@pytest.mark.parametrize(
    "value",
    [
        '{"a-token-that-must-not-leak": 5}',
        "a-token-that-must-not-leak",
        '{"a-token-that-must-not-leak": ""}',
        '{"must-not-leak": "x"}',
        '{"a-token-that-must-not-leak": "x"',
    ],
)
def test_a2a_token_errors_never_echo_the_tokens(value: str) -> None:
    with pytest.raises(Exception) as caught:
        A2ASettings(_env_file=None, tokens=value)  # type: ignore[call-arg]
    exc: Any = caught.value
    for text in (str(exc), format_validation_error(exc, A2ASettings), format_validation_error(exc)):
        assert "must-not-leak" not in text, text
        assert "TOKENS" in text.upper()
