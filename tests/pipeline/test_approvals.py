"""The approval gate: risky tool calls wait for /approve or /deny from an authorized sender.

Driven through the whole app (signed webhook → inbox → worker → agent with the real
OpenAI SDK → fake OpenAI server) with the risky built-in `write_file`.
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

from sqlalchemy import select

from app.db.models import approvals, outbox, runs
from app.sessions import queries
from app.sessions.window import is_legal_provider_input
from tests.app.agent.test_agent_e2e import ask, openai_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text

KEY = "webhook:c1"


def write_call(call_id: str = "call_write", path: str = "out.txt", content: str = "hello") -> ToolCall:
    return ToolCall("write_file", {"path": path, "content": content}, id=call_id)


def approval_id(reply_text: str) -> int:
    match = re.search(r"/approve (\d+)", reply_text)
    assert match, reply_text
    return int(match.group(1))


def only_text(body: dict[str, Any]) -> str:
    [reply] = body["replies"]
    return str(reply["text"])


async def rows(srv: Any, table: Any) -> list[dict[str, Any]]:
    async with srv.runtime.engine.connect() as conn:
        return [dict(r) for r in (await conn.execute(select(table).order_by(table.c.id))).mappings()]


async def history_is_legal(srv: Any, key: str = KEY) -> list[Any]:
    session = await queries.current_session(srv.runtime.engine, key)
    assert session is not None
    history = await srv.runtime.sessions.all_messages(session["id"])
    assert is_legal_provider_input(history), [(m.role, m.tool_call_id, m.tool_calls) for m in history]
    return history


def settings_for(fake: FakeOpenAI, workspace: Path, **kw: Any) -> dict[str, Any]:
    return openai_settings(fake, workspace_root=str(workspace), **kw)


def tool_result(request: Any, call_id: str) -> str:
    return next(m["content"] for m in request.messages if m.get("tool_call_id") == call_id)


async def test_an_approver_approves_and_the_run_continues(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call(), content="I'll write it."), text("Written."))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        async with serve(channel_settings=channel, **settings_for(fake, tmp_path)) as srv:
            async with srv.runtime.bus.subscribe(KEY) as queue:
                asked = only_text(await ask(srv, "please write out.txt"))
                events = [queue.get_nowait() for _ in range(queue.qsize())]
            assert asked.startswith("Tool write_file wants to run with")
            assert '"path": "out.txt"' in asked
            number = approval_id(asked)
            assert not (tmp_path / "out.txt").exists()
            [request] = [e for e in events if e["type"] == "approval_request"]
            assert request["approval_id"] == number and request["tool"] == "write_file"
            [pending] = await rows(srv, approvals)
            assert pending["status"] == "pending" and pending["tool_call_id"] == "call_write"
            [run] = await rows(srv, runs)
            assert run["outcome"] == "awaiting_approval"

            done = only_text(await ask(srv, f"/approve {number}", sender="boss"))
            assert done == "Written."
            assert (tmp_path / "out.txt").read_text() == "hello"
            assert json.loads(tool_result(fake.requests[1], "call_write")) == {"path": "out.txt", "bytes": 5}
            [decided] = await rows(srv, approvals)
            [run] = await rows(srv, runs)
            await history_is_legal(srv)
    assert (decided["status"], decided["decided_by"]) == ("approved", "boss")
    assert run["outcome"] == "ok"
    assert run["iterations"] == 2
    [call] = run["tool_calls"]
    assert (call["id"], call["decision"], call["decided_by"]) == ("call_write", "approved", "boss")
    assert len(run["event_ids"]) == 2  # the request and the /approve


async def test_a_non_approver_is_refused_and_a_deny_tells_the_model(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call()), text("Okay, I won't."))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        async with serve(channel_settings=channel, **settings_for(fake, tmp_path)) as srv:
            number = approval_id(only_text(await ask(srv, "write it")))
            refused = only_text(await ask(srv, f"/approve {number}", sender="u1"))
            assert refused == "You are not allowed to decide this approval."
            [still] = await rows(srv, approvals)
            assert still["status"] == "pending"
            unknown = only_text(await ask(srv, "/approve 999", sender="boss"))
            assert "no pending approval 999" in unknown

            final = only_text(await ask(srv, f"/deny {number}", sender="boss"))
            assert final == "Okay, I won't."
            assert "denied by boss" in json.loads(tool_result(fake.requests[1], "call_write"))["error"]
            assert not (tmp_path / "out.txt").exists()
            [run] = await rows(srv, runs)
            [decided] = await rows(srv, approvals)
            await history_is_legal(srv)
    assert (decided["status"], decided["decided_by"]) == ("denied", "boss")
    assert run["tool_calls"][0]["decision"] == "denied"
    assert run["details"]["approval_refusals"] == [{"sender": "u1", "command": "/approve"}]


async def test_no_answer_is_denied_by_the_timeout(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call()), text("Timed out, not written."))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        settings = settings_for(fake, tmp_path, approval_timeout_seconds=0.5, approval_sweep_seconds=0.1)
        async with serve(channel_settings=channel, **settings) as srv:
            approval_id(only_text(await ask(srv, "write it")))
            await fake.wait_requests(2, timeout=15)
            for _ in range(100):
                [run] = await rows(srv, runs)
                if run["outcome"] == "ok":
                    break
                await asyncio.sleep(0.05)
            [decided] = await rows(srv, approvals)
            replies = [r["payload"]["parts"][0]["text"] for r in await rows(srv, outbox)]
            await history_is_legal(srv)
        assert "no decision before the timeout" in tool_result(fake.requests[1], "call_write")
    assert (decided["status"], decided["decided_by"]) == ("expired", "timeout")
    assert run["outcome"] == "ok"
    assert run["tool_calls"][0]["decided_by"] == "timeout"
    assert replies[-1] == "Timed out, not written."
    assert not (tmp_path / "out.txt").exists()


async def test_a_pending_approval_survives_a_restart(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call(), write_call("call_second", "two.txt", "2")))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        settings = settings_for(fake, tmp_path)
        async with serve(channel_settings=channel, **settings) as srv:
            first = approval_id(only_text(await ask(srv, "write two files")))
        # a new process on the same database: nothing of the run is in memory
        fake.enqueue(text("Both written."))
        async with serve(channel_settings=channel, **settings) as srv:
            second_q = only_text(await ask(srv, f"/approve {first}", sender="boss"))
            second = approval_id(second_q)  # the group's next risky call asks again
            assert second != first and '"path": "two.txt"' in second_q
            done = only_text(await ask(srv, f"/approve {second}", sender="boss"))
            [run] = await rows(srv, runs)
            await history_is_legal(srv)
    assert done == "Both written."
    assert (tmp_path / "out.txt").read_text() == "hello"
    assert (tmp_path / "two.txt").read_text() == "2"
    assert [c["decision"] for c in run["tool_calls"]] == ["approved", "approved"]
    assert run["outcome"] == "ok"


async def test_without_an_approver_risky_calls_are_denied_at_once(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call()), text("I cannot write files here."))
        async with serve(**settings_for(fake, tmp_path)) as srv:  # webhook: no approvers configured
            assert only_text(await ask(srv, "write it")) == "I cannot write files here."
            [run] = await rows(srv, runs)
            assert await rows(srv, approvals) == []
        assert (
            "no one may approve this tool in this conversation (the operator can name approvers' "
            "sender ids in WEBHOOK_APPROVERS" in tool_result(fake.requests[1], "call_write")
        )
    assert run["tool_calls"][0] == {
        "id": "call_write",
        "name": "write_file",
        "ms": 0,
        "decision": "denied",
        "decided_by": "policy",
    }


async def test_own_requests_in_direct_chats_when_enabled(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call()), text("Done."))
        channel = {"webhook": webhook_settings(approve_own_requests_in_direct=True)}
        async with serve(channel_settings=channel, **settings_for(fake, tmp_path)) as srv:
            number = approval_id(only_text(await ask(srv, "write it", sender="me")))
            assert only_text(await ask(srv, f"/approve {number}", sender="other")).startswith("You are not")
            assert only_text(await ask(srv, f"/approve {number}", sender="me")) == "Done."
    assert (tmp_path / "out.txt").exists()


async def test_stop_or_a_new_message_closes_a_waiting_run(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(write_call("call_a")), calls(write_call("call_b")), text("Sure, something else."))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        async with serve(channel_settings=channel, **settings_for(fake, tmp_path)) as srv:
            approval_id(only_text(await ask(srv, "write it")))
            assert only_text(await ask(srv, "/stop")) == "Stopped."
            await history_is_legal(srv)
            approval_id(only_text(await ask(srv, "write it again")))
            assert only_text(await ask(srv, "no, do something else")) == "Sure, something else."
            history = await history_is_legal(srv)
            statuses = [(a["status"], a["decided_by"]) for a in await rows(srv, approvals)]
            outcomes = [r["outcome"] for r in await rows(srv, runs)]
        last = fake.requests[-1].messages
        assert "a new message arrived first" in tool_result(fake.requests[-1], "call_b")
        assert last[-1] == {"role": "user", "content": "no, do something else"}
    assert statuses == [("cancelled", "u1"), ("cancelled", "superseded")]
    assert outcomes == ["stopped", "superseded", "ok"]
    assert not (tmp_path / "out.txt").exists()
    assert next(m.content for m in history if m.role == "assistant" and not m.tool_calls) == "Stopped."


async def test_new_conversation_cancels_a_pending_approval(serve: ServeApp, tmp_path: Path) -> None:
    async with FakeOpenAI(default=text("Fresh start.")) as fake:
        fake.enqueue(calls(write_call()))
        channel = {"webhook": webhook_settings(approvers=["boss"])}
        async with serve(channel_settings=channel, **settings_for(fake, tmp_path)) as srv:
            number = approval_id(only_text(await ask(srv, "write it")))
            assert only_text(await ask(srv, "/new")) == "Started a new conversation."
            late = only_text(await ask(srv, f"/approve {number}", sender="boss"))
            assert only_text(await ask(srv, "hello again")) == "Fresh start."
            [cancelled] = await rows(srv, approvals)
            await history_is_legal(srv)
    assert "no pending approval" in late
    assert (cancelled["status"], cancelled["decided_by"]) == ("cancelled", "/new")
    assert not (tmp_path / "out.txt").exists()
