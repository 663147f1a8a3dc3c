"""The MCP server, end to end: the official `mcp` client over streamable HTTP against a
running server, on both stores."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.types import TextContent, TextResourceContents

from app.config import GatewayTokenSpec
from app.db.models import inbox, outbox
from channels.mcp_server import McpServerSettings
from tests.app.agent.test_agent_e2e import ask as webhook_ask
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count
from tests.channels.telegram.support import tg_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.telegram import FakeTelegram

TEAM = "mcp-token-of-team-a-0123456789"
OTHER = "mcp-token-scoped-to-team-prefix"
TG = "mcp-token-for-telegram-chat-42"


def mcp_settings(**overrides: Any) -> McpServerSettings:
    values: dict[str, Any] = {
        "tokens": [
            GatewayTokenSpec(token=TEAM, subject="n8n", key_prefix="webhook:team-a"),
            GatewayTokenSpec(token=OTHER, subject="ide", key_prefix="webhook:team-"),
            GatewayTokenSpec(token=TG, subject="ops", session_keys=["telegram:42"]),
        ]
    }
    values.update(overrides)
    return McpServerSettings(_env_file=None, **values)  # type: ignore[call-arg]


@asynccontextmanager
async def mcp_client(url: str, token: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client:
        yield client


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def structured(result: Any) -> Any:
    assert not result.is_error, text_of(result)
    data = result.structured_content
    return data["result"] if isinstance(data, dict) and set(data) == {"result"} else data


async def test_tools_are_listed_and_a_wrong_token_is_refused(serve: ServeApp) -> None:
    async with serve(channel_settings={"mcp": mcp_settings(), "webhook": webhook_settings()}) as srv:
        async with mcp_client(srv.url, TEAM) as client:
            tools = {t.name for t in (await client.list_tools()).tools}
            templates = [t.uri_template for t in (await client.list_resource_templates()).resource_templates]
        assert {"ask", "send_message", "list_sessions", "get_history"} <= tools
        assert templates == ["chatgate://sessions/{key}/history"]
        async with httpx.AsyncClient(timeout=30) as http:
            wrong = await http.post(
                f"{srv.url}/mcp",
                headers={"Authorization": "Bearer not-a-known-token-at-all"},
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            )
        assert wrong.status_code == 401
        assert "not-a-known-token" not in wrong.text


async def test_ask_twice_in_one_session_sees_the_first_exchange(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Hello Grace."), text("You are Grace."))
        channels = {"mcp": mcp_settings(), "webhook": webhook_settings()}
        async with serve(channel_settings=channels, **openai_settings(fake)) as srv:
            async with mcp_client(srv.url, TEAM) as client:
                first = await client.call_tool("ask", {"session": "notes", "text": "I am Grace."})
                second = await client.call_tool("ask", {"session": "notes", "text": "Who am I?"})
                listed = structured(await client.call_tool("list_sessions", {}))
                own = structured(await client.call_tool("get_history", {"key": "mcp:n8n:notes"}))
            requests = await fake.wait_requests(2)
    assert text_of(first) == "Hello Grace."
    assert text_of(second) == "You are Grace."
    said = [(m["role"], m.get("content")) for m in requests[1].messages if m["role"] != "system"]
    assert said == [("user", "I am Grace."), ("assistant", "Hello Grace."), ("user", "Who am I?")]
    assert [s["key"] for s in listed] == ["mcp:n8n:notes"]
    assert [(m["role"], m["content"]) for m in own][-2:] == [
        ("user", "Who am I?"),
        ("assistant", "You are Grace."),
    ]


async def test_a_token_reads_only_the_sessions_it_is_granted(serve: ServeApp) -> None:
    async with serve(channel_settings={"mcp": mcp_settings(), "webhook": webhook_settings()}) as srv:
        for chat in ("team-a", "team-b", "other"):
            await webhook_ask(srv, f"hello from {chat}", chat=chat)
        async with mcp_client(srv.url, TEAM) as team, mcp_client(srv.url, OTHER) as scoped:
            assert [s["key"] for s in structured(await team.call_tool("list_sessions", {}))] == [
                "webhook:team-a"
            ]
            history = structured(await team.call_tool("get_history", {"key": "webhook:team-a"}))
            assert [m["content"] for m in history] == ["hello from team-a", "You said: hello from team-a"]
            resource = await team.read_resource(
                f"chatgate://sessions/{quote('webhook:team-a', safe='')}/history"
            )
            [contents] = resource.contents
            assert isinstance(contents, TextResourceContents)
            assert [m["content"] for m in json.loads(contents.text)] == [
                "hello from team-a",
                "You said: hello from team-a",
            ]

            # `webhook:team-` grants whole components: neither webhook:other nor webhook:team-b.
            denied = await scoped.call_tool("get_history", {"key": "webhook:other"})
            assert denied.is_error and "hello from other" not in text_of(denied)
            assert (await scoped.call_tool("get_history", {"key": "webhook:team-b"})).is_error
            assert structured(await scoped.call_tool("list_sessions", {})) == []
            with pytest.raises(Exception, match="no session"):
                await scoped.read_resource(f"chatgate://sessions/{quote('webhook:other', safe='')}/history")


async def test_send_message_reaches_telegram_only_where_granted(serve: ServeApp) -> None:
    async with FakeTelegram() as tg:
        channels = {"mcp": mcp_settings(), "telegram": tg_settings(tg), "webhook": webhook_settings()}
        async with serve(channel_settings=channels) as srv:
            async with mcp_client(srv.url, TG) as ops, mcp_client(srv.url, TEAM) as team:
                sent = structured(
                    await ops.call_tool(
                        "send_message",
                        {"channel": "telegram", "chat_id": "42", "text": "Deploy done.", "message_id": "d1"},
                    )
                )
                again = await ops.call_tool(
                    "send_message",
                    {"channel": "telegram", "chat_id": "42", "text": "Deploy done.", "message_id": "d1"},
                )
                assert not again.is_error
                refused = await ops.call_tool(
                    "send_message", {"channel": "telegram", "chat_id": "43", "text": "x"}
                )
                assert refused.is_error
                assert (
                    await team.call_tool(
                        "send_message", {"channel": "telegram", "chat_id": "42", "text": "x"}
                    )
                ).is_error
                # A channel whose replies are read, not sent (the webhook without a callback URL).
                assert (
                    await team.call_tool(
                        "send_message", {"channel": "webhook", "chat_id": "team-a", "text": "x"}
                    )
                ).is_error
            [call] = await tg.wait_for("sendMessage", 1)
            assert await count(srv.runtime, outbox) == 1  # the retry with the same message_id: one row
    assert sent["queued"] and sent["session_key"] == "telegram:42"
    assert str(call.params["chat_id"]) == "42" and call.params["text"] == "Deploy done."


async def test_ask_with_the_same_request_id_is_one_turn(serve: ServeApp) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(text("Once."), text("Twice!"))
        channels = {"mcp": mcp_settings(), "webhook": webhook_settings()}
        async with serve(channel_settings=channels, **openai_settings(fake)) as srv:
            async with mcp_client(srv.url, TEAM) as client:
                ask = {"session": "s", "text": "do it", "request_id": "run-1"}
                first = await client.call_tool("ask", ask)
                again = await client.call_tool("ask", ask)
            assert await count(srv.runtime, inbox) == 1
    assert text_of(first) == text_of(again) == "Once."
    assert len(fake.requests) == 1
