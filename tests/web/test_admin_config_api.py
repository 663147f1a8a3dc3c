"""GET /admin/api/config: the effective settings, read-only, with no secret value in it."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pydantic import SecretStr
from pydantic_settings import BaseSettings
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from app.config_view import REDACTED, settings_view
from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.support.webhook import post_webhook

AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
GATEWAY_TOKEN = "gw-token-that-must-not-leak-123"
API_KEY = "sk-api-key-that-must-not-leak"
MCP_BEARER = "Bearer mcp-header-that-must-not-leak"
TOKEN_SECRET = "signing-secret-that-must-not-leak"
MCP_URL = "http://127.0.0.1:9/mcp"


async def test_config_shows_settings_and_no_secret(serve: ServeApp) -> None:
    async with (
        serve(
            llm_api_key=API_KEY,
            llm_model="my-model",
            gateway_token_secret=TOKEN_SECRET,
            gateway_tokens=[{"token": GATEWAY_TOKEN, "subject": "alice", "session_keys": ["web:alice"]}],
            mcp_servers=[{"name": "x", "url": MCP_URL, "headers": {"Authorization": MCP_BEARER}}],
        ) as srv,
        httpx.AsyncClient(base_url=srv.url, timeout=30) as client,
    ):
        assert (await client.get("/admin/api/config")).status_code == 401
        resp = await client.get("/admin/api/config", headers=AUTH)
        assert resp.status_code == 200, resp.text
        body = resp.text
        for secret in (ADMIN_TOKEN, WEBHOOK_SECRET, GATEWAY_TOKEN, API_KEY, MCP_BEARER, TOKEN_SECRET):
            assert secret not in body, secret
        data = resp.json()
        sections = {s["name"]: {r["name"]: r for r in s["settings"]} for s in data["sections"]}
        assert set(sections) == {"core", "webhook"}
        core, webhook = sections["core"], sections["webhook"]
        for name in ("admin_token", "llm_api_key", "gateway_token_secret", "gateway_tokens"):
            assert core[name]["secret"] and core[name]["value"] == REDACTED and core[name]["is_set"], name
        assert core["llm_fallback_api_key"]["secret"] and core["llm_fallback_api_key"]["value"] is None
        assert webhook["secret"]["secret"] and webhook["secret"]["value"] == REDACTED
        assert webhook["secret"]["env"] == "WEBHOOK_SECRET"
        # ordinary settings are shown as they are
        assert core["llm_model"]["value"] == "my-model" and not core["llm_model"]["secret"]
        assert core["gateway_token_ttl_seconds"]["secret"] is False  # a number, not a secret
        assert core["history_max_tokens"]["secret"] is False
        assert core["mcp_servers"]["value"][0]["url"] == MCP_URL
        assert core["mcp_servers"]["value"][0]["headers"] == REDACTED


class _Example(BaseSettings):
    database_url: str = "postgresql://app:hunter2@db.internal:5432/chat"
    signing: SecretStr = SecretStr("from-the-type")
    marked: str = "from-the-field"
    public_key: str = "not-a-secret"

    model_config = {"env_prefix": "EX_"}


_Example.model_fields["marked"].json_schema_extra = {"secret": True}


def test_secrets_are_found_by_type_field_marker_name_and_url_password() -> None:
    rows = {r["name"]: r for r in settings_view(_Example(_env_file=None))}  # type: ignore[call-arg]
    dumped = json.dumps(rows)
    for secret in ("hunter2", "from-the-type", "from-the-field"):
        assert secret not in dumped
    assert rows["database_url"]["value"] == f"postgresql://app:{REDACTED}@db.internal:5432/chat"
    assert rows["signing"]["secret"] and rows["marked"]["secret"]
    assert rows["public_key"]["value"] == "not-a-secret"
    assert rows["signing"]["env"] == "EX_SIGNING"


async def test_live_socket_needs_the_admin_token_and_says_change(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as client:
        url = "ws" + srv.url.removeprefix("http") + "/admin/api/live"
        for headers in ({}, {"Authorization": "Bearer wrong"}, {**AUTH, "Origin": "https://evil.example"}):
            with pytest.raises(InvalidStatus):  # refused at the upgrade: nothing to read
                async with connect(url, additional_headers=headers, open_timeout=10) as ws:
                    await ws.recv()
        async with connect(url, additional_headers=AUTH, open_timeout=10) as ws:
            assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "hello"}
            payload = {"chat_id": "c1", "sender_id": "u1", "text": "hello"}
            assert (await post_webhook(client, srv.url, WEBHOOK_SECRET, payload)).status_code == 202
            assert json.loads(await asyncio.wait_for(ws.recv(), 10)) == {"type": "change"}
