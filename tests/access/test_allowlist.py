"""Allowlists edited while the service runs (admin API, CLI), with the static settings
still honoured, through the signed webhook on both backends."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from app.cli import main
from tests.access.support import stored
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def _talk(http: httpx.AsyncClient, url: str, sender: str, chat: str | None = None) -> Any:
    body: dict[str, Any] = {
        "chat_id": chat or f"dm-{sender}",
        "sender_id": sender,
        "text": f"hi from {sender}",
    }
    if chat is not None:
        body["chat_type"] = "group"
    resp = await post_webhook(http, url, WEBHOOK_SECRET, body, wait=True)
    assert resp.status_code in (200, 202), resp.text
    return resp.json()


def _answered(body: Any) -> bool:
    return not body.get("skipped") and bool(body.get("replies"))


async def test_entries_added_and_removed_at_runtime(serve: ServeApp) -> None:
    channel = webhook_settings(access="allowlist", allowed_senders=["static"])
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:
        entries = f"{srv.url}/admin/api/access/entries"
        assert _answered(await _talk(http, srv.url, "static"))  # the static list still counts
        refused = await _talk(http, srv.url, "carol")
        assert refused["reason"] == "not_allowed" and "notice" not in refused
        before = await stored(srv.runtime)

        added = await http.post(
            entries, json={"channel": "webhook", "id": "carol", "note": "VIP"}, headers=AUTH
        )
        assert added.status_code == 201 and added.json()["added"] is True
        again = await http.post(entries, json={"channel": "webhook", "id": "carol"}, headers=AUTH)
        assert again.json()["added"] is False
        assert _answered(await _talk(http, srv.url, "carol"))

        # A group chat entry lets everyone in that group talk, and nobody in another.
        group = {"channel": "webhook", "kind": "chat", "id": "team"}
        assert (await http.post(entries, json=group, headers=AUTH)).status_code == 201
        assert _answered(await _talk(http, srv.url, "dave", chat="team"))
        assert (await _talk(http, srv.url, "dave", chat="other"))["reason"] == "not_allowed"

        listed = (await http.get(entries, params={"channel": "webhook"}, headers=AUTH)).json()["entries"]
        assert [(e["kind"], e["subject"], e["note"]) for e in listed] == [
            ("chat", "team", None),
            ("sender", "carol", "VIP"),
        ]
        gone = await http.delete(entries, params={"channel": "webhook", "id": "carol"}, headers=AUTH)
        assert gone.status_code == 200
        assert (
            await http.delete(entries, params={"channel": "webhook", "id": "carol"}, headers=AUTH)
        ).status_code == 404
        assert (await _talk(http, srv.url, "carol"))["reason"] == "not_allowed"

        # Bad input: a clear 4xx, nothing stored, and the service keeps serving.
        for body, status in (
            ({"channel": "nochannel", "id": "x"}, 400),
            ({"channel": "webhook", "kind": "robot", "id": "x"}, 422),
            ({"channel": "webhook"}, 422),
            ({"channel": "webhook", "id": "x" * 300}, 422),
            ({"channel": "webhook", "id": "bad\x00id"}, 400),
            ({"channel": "webhook", "id": "half \ud800"}, 400),
            ({"channel": "webhook", "id": "ok", "note": "nul \x00"}, 400),
        ):
            # json.dumps escapes a lone surrogate (httpx's own encoder would refuse it).
            raw = json.dumps(body).encode()
            headers = {**AUTH, "Content-Type": "application/json"}
            resp = await http.post(entries, content=raw, headers=headers)
            assert resp.status_code == status, (body, resp.text)
            assert resp.json()["detail"]
        assert (await http.post(entries, json={"channel": "webhook", "id": "x"})).status_code == 401
        after = (await http.get(entries, headers=AUTH)).json()["entries"]
        assert [e["subject"] for e in after] == ["team"]
        assert (await stored(srv.runtime))["inbox"] == before["inbox"] + 2
        overview = (await http.get(f"{srv.url}/admin/api/access", headers=AUTH)).json()
        assert overview["channels"]["webhook"]["access"] == "allowlist"
        assert overview["channels"]["webhook"]["allowed_senders"] == ["static"]


async def test_unset_mode_keeps_the_old_rule(serve: ServeApp) -> None:
    """No WEBHOOK_ACCESS: a static sender list is an allowlist (stored entries count too)."""
    channel = webhook_settings(allowed_senders=["static"])
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:
        assert (await _talk(http, srv.url, "erin"))["reason"] == "not_allowed"
        await srv.runtime.access.store.add("webhook", "sender", "erin")
        assert _answered(await _talk(http, srv.url, "erin"))


async def test_cli_allows_lists_and_removes(
    serve: ServeApp, db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`chatgate access …` in this process (test_pairing runs it as a subprocess)."""
    monkeypatch.setenv("DATABASE_URL", db_url)

    async def cli(*args: str) -> tuple[int, str]:
        code = await asyncio.to_thread(main, ["access", *args])
        return code, capsys.readouterr().out

    channel = webhook_settings(access="allowlist")
    async with serve(channel_settings={"webhook": channel}) as srv, httpx.AsyncClient(timeout=30) as http:
        assert (await _talk(http, srv.url, "frank"))["reason"] == "not_allowed"
        added, _ = await cli("allow", "webhook", "frank", "--note", "from the CLI")
        assert added == 0
        assert _answered(await _talk(http, srv.url, "frank"))
        _, out = await cli("list", "--channel", "webhook")
        assert [(e["subject"], e["note"]) for e in json.loads(out)["entries"]] == [("frank", "from the CLI")]
        removed, out = await cli("remove", "webhook", "frank")
        assert removed == 0 and json.loads(out)["removed"] is True
        assert (await cli("remove", "webhook", "frank"))[0] == 1
        assert (await _talk(http, srv.url, "frank"))["reason"] == "not_allowed"
