"""Memory that respects the room: a user's personal memory is recalled in direct chats;
in a group shared with others only what that user stored as shareable. Two users, one
group, through the signed webhook and a fake OpenAI server."""

from __future__ import annotations

import httpx

from tests.agents.test_agents import post, system_text
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text

PIN = "My bank PIN is 4321"
ON_CALL = "I am the on-call lead this week"


async def test_personal_memory_stays_out_of_a_shared_group_unless_shareable(serve: ServeApp) -> None:
    channel = {"webhook": webhook_settings(require_mention_in_groups=False)}
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(
                ToolCall("remember", {"content": PIN}, id="m1"),
                ToolCall("remember", {"content": ON_CALL, "shareable": True}, id="m2"),
            ),
            text("Noted."),
            text("hi alice"),  # alice in the group
            text("hi bob"),  # bob in the group
            text("in private"),  # alice in her DM again
        )
        running = serve(channel_settings=channel, **openai_settings(fake))
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "remember these", chat="alice-dm", sender="alice") == "Noted."
            group = {"chat": "team", "chat_type": "group"}
            assert await post(client, srv, "hi all", sender="alice", **group) == "hi alice"
            assert await post(client, srv, "what's up", sender="bob", **group) == "hi bob"
            assert await post(client, srv, "anything new?", chat="alice-dm", sender="alice") == "in private"
        alice_group, bob_group, alice_dm = (system_text(r) for r in fake.requests[2:])
        assert ON_CALL in alice_group and PIN not in alice_group
        assert ON_CALL not in bob_group and PIN not in bob_group
        assert ON_CALL in alice_dm and PIN in alice_dm


async def test_the_recall_tool_in_a_shared_group_finds_only_the_senders_shareable_entries(
    serve: ServeApp,
) -> None:
    channel = {"webhook": webhook_settings(require_mention_in_groups=False)}
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(
                ToolCall("remember", {"content": PIN}, id="m1"),
                ToolCall("remember", {"content": ON_CALL, "shareable": True}, id="m2"),
            ),
            text("Noted."),
            calls(ToolCall("recall", {"scope": "user"}, id="r1")),  # alice asks in the group
            text("alice's answer"),
            calls(ToolCall("recall", {}, id="r2")),  # bob asks in the group
            text("bob's answer"),
        )
        running = serve(channel_settings=channel, **openai_settings(fake))
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            assert await post(client, srv, "remember these", chat="alice-dm", sender="alice") == "Noted."
            group = {"chat": "team", "chat_type": "group"}
            assert await post(client, srv, "what do you know?", sender="alice", **group) == "alice's answer"
            assert await post(client, srv, "and about me?", sender="bob", **group) == "bob's answer"

        def recalled(request: object) -> str:
            """The newest tool result the request carries (the group's history has earlier ones)."""
            return str([m for m in getattr(request, "messages") if m["role"] == "tool"][-1]["content"])  # noqa: B009

        alice_tool, bob_tool = recalled(fake.requests[3]), recalled(fake.requests[5])
        assert ON_CALL in alice_tool and PIN not in alice_tool
        assert bob_tool == '{"memories": []}'  # bob has nothing; alice's entries are hers
