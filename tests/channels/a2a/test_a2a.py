"""The A2A server, end to end: the official `a2a-sdk` client against a running server, on
both backends."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, ClientConfig, create_client
from a2a.client.client import Client
from a2a.client.errors import A2AClientError
from a2a.types.a2a_pb2 import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    StreamResponse,
    Task,
    TaskState,
)
from a2a.utils.errors import (
    ContentTypeNotSupportedError,
    InvalidParamsError,
    InvalidRequestError,
    TaskNotCancelableError,
    TaskNotFoundError,
)
from sqlalchemy import select

from app.db.models import inbox, messages, sessions
from channels.a2a import A2ASettings
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.support import count
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, calls, text
from tests.pipeline.test_approvals import approval_id, write_call
from tests.support.timing import scaled

TOKEN_A = "token-of-agent-one-0123456789"
TOKEN_B = "token-of-agent-two-0123456789"


def a2a_settings(**overrides: Any) -> A2ASettings:
    values: dict[str, Any] = {"tokens": {TOKEN_A: "agent-one", TOKEN_B: "agent-two"}}
    values.update(overrides)
    return A2ASettings(_env_file=None, **values)  # type: ignore[call-arg]


def channels(**overrides: Any) -> dict[str, Any]:
    return {"a2a": a2a_settings(**overrides), "webhook": webhook_settings()}


@asynccontextmanager
async def sdk_client(url: str, token: str, *, streaming: bool = False) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(timeout=30, headers={"Authorization": f"Bearer {token}"}) as http:
        client = await create_client(url, ClientConfig(httpx_client=http, streaming=streaming))
        try:
            yield client
        finally:
            await client.close()


def user_message(
    text: str, context_id: str = "", message_id: str | None = None, task_id: str = ""
) -> Message:
    return Message(
        message_id=message_id or uuid.uuid4().hex,
        context_id=context_id,
        task_id=task_id,
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
    )


async def send(client: Client, message: Message, *, immediately: bool = False) -> list[StreamResponse]:
    request = SendMessageRequest(
        message=message, configuration=SendMessageConfiguration(return_immediately=immediately)
    )
    return [event async for event in client.send_message(request)]


async def only_task(client: Client, message: Message, *, immediately: bool = False) -> Task:
    [response] = await send(client, message, immediately=immediately)
    assert response.HasField("task"), response
    return response.task


async def wait_state(client: Client, task_id: str, states: set[int], timeout: float = 20) -> Task:
    deadline = asyncio.get_running_loop().time() + scaled(timeout)
    while True:
        task = await client.get_task(GetTaskRequest(id=task_id))
        if task.status.state in states:
            return task
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"task stayed {TaskState.Name(task.status.state)}")
        await asyncio.sleep(0.1)


def reply_text(task: Task) -> str:
    return "\n".join(p.text for a in task.artifacts for p in a.parts)


async def history_texts(runtime: Any, key: str) -> list[str]:
    async with runtime.engine.connect() as conn:
        rows = await conn.execute(
            select(messages.c.content)
            .join(sessions, sessions.c.id == messages.c.session_id)
            .where(sessions.c.key == key)
            .order_by(messages.c.seq)
        )
        return [str(r[0]) for r in rows]


async def test_card_is_discovered_with_bearer_scheme_and_public_urls(serve: ServeApp) -> None:
    settings = channels(public_base_url="https://agents.example.com/gw")
    async with serve(channel_settings=settings) as srv, httpx.AsyncClient(timeout=30) as http:
        card = await A2ACardResolver(http, srv.url).get_agent_card()
    assert card.name == "chatgate"
    assert card.capabilities.streaming
    [interface] = card.supported_interfaces
    assert interface.url == "https://agents.example.com/gw/a2a"
    assert interface.protocol_binding == "JSONRPC"
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme.lower() == "bearer"
    assert "bearer" in card.security_requirements[0].schemes
    assert [s.id for s in card.skills] == ["chat"]


async def test_send_returns_the_reply_and_get_reads_it_back(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        task = await only_task(client, user_message("hello there", context_id="ctx-1"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert task.context_id == "ctx-1"
        assert reply_text(task) == "You said: hello there"
        assert task.status.message.parts[0].text == "You said: hello there"

        again = await client.get_task(GetTaskRequest(id=task.id))
        assert again.status.state == TaskState.TASK_STATE_COMPLETED
        assert reply_text(again) == "You said: hello there"
        assert [m.role for m in again.history] == [Role.ROLE_USER, Role.ROLE_AGENT]

        async with srv.runtime.engine.connect() as conn:
            row = (await conn.execute(select(inbox).where(inbox.c.event_id == task.id))).mappings().one()
        assert row["session_key"] == "a2a:agent-one:ctx-1"
        assert row["status"] == "done"


async def test_a_tool_turn_answers_through_a2a(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        task = await only_task(client, user_message("what time is it?", context_id="c"))
        assert task.status.state == TaskState.TASK_STATE_COMPLETED
        assert reply_text(task).startswith("It is ")


async def test_same_message_id_is_one_task_and_one_event(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        first = await only_task(client, user_message("once", "c", message_id="m-1"))
        second = await only_task(client, user_message("once", "c", message_id="m-1"))
        assert first.id == second.id
        assert await count(srv.runtime, inbox) == 1


async def test_streaming_follows_the_task_to_its_reply(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels(), offline_latency_ms=1000) as srv,
        sdk_client(srv.url, TOKEN_A, streaming=True) as client,
    ):
        events = await send(client, user_message("stream me", "s-1"))
    assert events[0].HasField("task")
    task_id = events[0].task.id
    states = [e.status_update.status.state for e in events if e.HasField("status_update")]
    assert states[-1] == TaskState.TASK_STATE_COMPLETED
    assert TaskState.TASK_STATE_WORKING in [events[0].task.status.state, *states]
    artifacts = [e.artifact_update for e in events if e.HasField("artifact_update")]
    assert [a.artifact.parts[0].text for a in artifacts] == ["You said: stream me"]
    assert all(a.task_id == task_id for a in artifacts)


async def test_cancel_stops_a_running_task_and_a_finished_one_cannot_be(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels(), offline_latency_ms=3000, stop_poll_seconds=0.1) as srv,
        sdk_client(srv.url, TOKEN_A) as client,
    ):
        task = await only_task(client, user_message("take your time", "c"), immediately=True)
        assert task.status.state in (TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING)
        await wait_state(client, task.id, {TaskState.TASK_STATE_WORKING})
        canceled = await client.cancel_task(CancelTaskRequest(id=task.id))
        assert canceled.status.state == TaskState.TASK_STATE_CANCELED
        # The turn is stopped, and the task stays canceled once the inbox row settles.
        async with asyncio.timeout(10):
            while True:
                async with srv.runtime.engine.connect() as conn:
                    status = (
                        await conn.execute(select(inbox.c.status).where(inbox.c.event_id == task.id))
                    ).scalar_one()
                if status not in ("pending", "processing"):
                    break
                await asyncio.sleep(0.1)
        after = await client.get_task(GetTaskRequest(id=task.id))
        assert after.status.state == TaskState.TASK_STATE_CANCELED
        assert "You said: take your time" not in await history_texts(srv.runtime, "a2a:agent-one:c")

        done = await only_task(client, user_message("quick", "c2"))
        assert done.status.state == TaskState.TASK_STATE_COMPLETED
        with pytest.raises(TaskNotCancelableError, match="already finished"):
            await client.cancel_task(CancelTaskRequest(id=done.id))


async def test_a_task_canceled_while_queued_never_reaches_the_model(serve: ServeApp) -> None:
    """Two messages in one context; the second is canceled while the first runs."""
    async with FakeOpenAI() as fake:
        hold = asyncio.Event()
        fake.enqueue(text("First answer.", hold=hold), text("Third answer."))
        async with (
            serve(channel_settings=channels(), **openai_settings(fake)) as srv,
            sdk_client(srv.url, TOKEN_A) as client,
        ):
            first = await only_task(client, user_message("first question", "q"), immediately=True)
            second = await only_task(client, user_message("second question", "q"), immediately=True)
            await fake.wait_requests(1)  # the first turn is at the model
            assert (await client.get_task(GetTaskRequest(id=second.id))).status.state == (
                TaskState.TASK_STATE_SUBMITTED
            )
            canceled = await client.cancel_task(CancelTaskRequest(id=second.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            hold.set()
            done = await wait_state(client, first.id, {TaskState.TASK_STATE_COMPLETED})
            assert reply_text(done) == "First answer."  # the first turn was not stopped
            # Anything queued after the canceled task runs: the session is not held up.
            third = await only_task(client, user_message("third question", "q"))
            assert third.status.state == TaskState.TASK_STATE_COMPLETED
            after = await client.get_task(GetTaskRequest(id=second.id))
            assert after.status.state == TaskState.TASK_STATE_CANCELED
            assert not after.artifacts
            async with srv.runtime.engine.connect() as conn:
                status = (
                    await conn.execute(select(inbox.c.status).where(inbox.c.event_id == second.id))
                ).scalar_one()
            assert status == "canceled"
            history = await history_texts(srv.runtime, "a2a:agent-one:q")
        sent = [str(m.get("content")) for r in fake.requests for m in r.messages]
        assert len(fake.requests) == 2
        assert not any("second question" in c for c in sent)
        assert "second question" not in history
        assert "first question" in history and "third question" in history


async def test_same_context_id_from_another_caller_is_another_session(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels()) as srv,
        sdk_client(srv.url, TOKEN_A) as one,
        sdk_client(srv.url, TOKEN_B) as two,
    ):
        secret = await only_task(one, user_message("my secret is 42", "shared"))
        theirs = await only_task(two, user_message("what did they say?", "shared"))
        assert theirs.context_id == "shared"
        assert "42" not in reply_text(theirs)
        with pytest.raises(TaskNotFoundError):
            await two.get_task(GetTaskRequest(id=secret.id))
        with pytest.raises(TaskNotFoundError):
            await two.cancel_task(CancelTaskRequest(id=secret.id))
        with pytest.raises(TaskNotFoundError):  # nor continue it
            await send(two, user_message("more", "shared", task_id=secret.id))
        async with srv.runtime.engine.connect() as conn:
            keys = {r[0] for r in await conn.execute(select(inbox.c.session_key))}
        assert keys == {"a2a:agent-one:shared", "a2a:agent-two:shared"}
        assert not any("42" in t for t in await history_texts(srv.runtime, "a2a:agent-two:shared"))


async def test_context_ids_are_escaped_into_the_key(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        await only_task(client, user_message("hi", "x:agent-two:y"))
        async with srv.runtime.engine.connect() as conn:
            key = (await conn.execute(select(inbox.c.session_key))).scalar_one()
    assert key == "a2a:agent-one:x%3Aagent-two%3Ay"


async def test_wrong_or_missing_token_is_refused_with_401(serve: ServeApp) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}},
    }
    async with serve(channel_settings=channels()) as srv, httpx.AsyncClient(timeout=30) as http:
        wrong = await http.post(f"{srv.url}/a2a", json=body, headers={"Authorization": "Bearer nope"})
        missing = await http.post(f"{srv.url}/a2a", json=body)
        assert wrong.status_code == 401 and missing.status_code == 401
        assert wrong.headers["www-authenticate"].startswith("Bearer")
        with pytest.raises(A2AClientError, match="401"):
            async with sdk_client(srv.url, "not-a-known-token-at-all") as client:
                await send(client, user_message("hi", "c"))
        assert await count(srv.runtime, inbox) == 0


async def test_bad_messages_are_refused_and_nothing_is_stored(serve: ServeApp) -> None:
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        no_text = Message(message_id="m1", role=Role.ROLE_USER, parts=[Part(url="https://x/y.png")])
        with pytest.raises(ContentTypeNotSupportedError, match="text"):
            await send(client, no_text)
        with pytest.raises(TaskNotFoundError):
            await send(client, user_message("hi", "c", task_id="no-such-task"))
        with pytest.raises(InvalidParamsError, match="characters"):
            await send(client, user_message("hi", "c" * 300))
        async with httpx.AsyncClient(timeout=30) as http:
            garbage = await http.post(
                f"{srv.url}/a2a",
                content=b"{not json",
                headers={"Authorization": f"Bearer {TOKEN_A}", "Content-Type": "application/json"},
            )
            assert garbage.json()["error"]["code"] == -32700
        assert await count(srv.runtime, inbox) == 0
        ok = await only_task(client, user_message("still serving", "c"))
        assert ok.status.state == TaskState.TASK_STATE_COMPLETED


async def test_turn_cap_bounds_a_context(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels(max_turns_per_context=2)) as srv,
        sdk_client(srv.url, TOKEN_A) as client,
    ):
        await only_task(client, user_message("one", "loop"))
        await only_task(client, user_message("two", "loop"))
        with pytest.raises(InvalidRequestError, match="cap"):
            await send(client, user_message("three", "loop"))
        fresh = await only_task(client, user_message("three", "other"))
        assert fresh.status.state == TaskState.TASK_STATE_COMPLETED
        assert await count(srv.runtime, inbox) == 3


async def test_v03_method_names_are_served_too(serve: ServeApp) -> None:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "message/send",
        "params": {
            "message": {"messageId": "m03", "role": "user", "parts": [{"kind": "text", "text": "old client"}]}
        },
    }
    async with serve(channel_settings=channels()) as srv, httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{srv.url}/a2a", json=body, headers={"Authorization": f"Bearer {TOKEN_A}"})
    assert resp.status_code == 200, resp.text
    result = resp.json()["result"]
    assert result["status"]["state"] == "completed"
    assert result["artifacts"][0]["parts"][0]["text"] == "You said: old client"


async def test_a2a_is_absent_when_not_enabled(serve: ServeApp) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=30) as http:
        assert (await http.get(f"{srv.url}/.well-known/agent-card.json")).status_code == 404
        assert (await http.post(f"{srv.url}/a2a", json={})).status_code == 404


async def test_approval_makes_the_task_input_required_until_answered(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call(), content="I'll write it."), text("Written."))
        settings = openai_settings(fake, workspace_root=str(tmp_path))
        async with (
            serve(channel_settings=channels(approvers=["agent-one"]), **settings) as srv,
            sdk_client(srv.url, TOKEN_A) as client,
        ):
            asked = await only_task(client, user_message("please write out.txt", "files"))
            assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
            number = approval_id(asked.status.message.parts[0].text)
            assert not (tmp_path / "out.txt").exists()

            answer = await only_task(client, user_message(f"/approve {number}", "files", task_id=asked.id))
            assert answer.context_id == "files"
            assert answer.status.state == TaskState.TASK_STATE_COMPLETED
            assert (tmp_path / "out.txt").read_text() == "hello"
            before = await client.get_task(GetTaskRequest(id=asked.id))
            assert before.status.state == TaskState.TASK_STATE_COMPLETED  # no longer waiting
            assert await count(srv.runtime, inbox) == 2
