"""What the agent does reaches the browser: streaming deltas, tool calls, approvals,
command answers, /stop — through the gateway, with the real OpenAI SDK against a fake."""

from __future__ import annotations

from pathlib import Path

from tests.app.agent.test_agent_e2e import openai_settings
from tests.fakes.openai_server import FakeOpenAI, ToolCall, calls, text
from tests.gateway.conftest import ALICE_TOKEN, GatewayServe, browser_settings, gateway_client


async def test_streamed_answer_arrives_as_deltas_then_the_message(gateway_serve: GatewayServe) -> None:
    async with FakeOpenAI(chunk_size=3) as fake:
        fake.enqueue(text("Hello from a streaming model!"))
        async with gateway_serve(**openai_settings(fake)) as srv:
            async with gateway_client(srv.url, ALICE_TOKEN) as c:
                await c.attach()
                await c.send({"type": "send", "text": "hi", "client_message_id": "1"})
                answer = (await c.messages_until_answer())[-1]
                deltas = [f for f in c.frames if f["type"] == "delta"]
                assert len(deltas) > 1
                assert (
                    "".join(d["text"] for d in deltas) == answer["content"] == "Hello from a streaming model!"
                )
                assert {d["run_id"] for d in deltas} == {answer["run_id"]}


async def test_approval_through_the_gateway(gateway_serve: GatewayServe, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        write = ToolCall("write_file", {"path": "out.txt", "content": "hello"}, id="call_w")
        fake.enqueue(calls(write, content="I'll write it."), text("Written."))
        settings = openai_settings(fake, workspace_root=str(tmp_path))
        async with gateway_serve(browser=browser_settings(approvers=["alice"]), **settings) as srv:
            async with gateway_client(srv.url, ALICE_TOKEN) as c:
                await c.attach()
                await c.send({"type": "send", "text": "please write out.txt", "client_message_id": "1"})
                request = await c.expect("approval_request")
                assert request["tool"] == "write_file" and request["arguments"] == {
                    "path": "out.txt",
                    "content": "hello",
                }
                call = next(f for f in c.frames if f["type"] == "message" and f.get("tool_calls"))
                assert call["tool_calls"][0]["id"] == "call_w"
            assert not (tmp_path / "out.txt").exists()
            # A tab opened now sees the pending approval in `ready`, and approves it.
            async with gateway_client(srv.url, ALICE_TOKEN) as c:
                ready = await c.attach()
                [pending] = ready["pending_approvals"]
                assert pending["approval_id"] == request["approval_id"] and pending["tool"] == "write_file"
                await c.send(
                    {"type": "approve", "approval_id": request["approval_id"], "client_message_id": "a"}
                )
                assert (await c.expect("accepted"))["duplicate"] is False
                decided = await c.expect("approval_decided")
                assert decided["status"] == "approved" and decided["decided_by"] == "alice"
                got = await c.messages_until_answer()
                assert [m["role"] for m in got][-2:] == ["tool", "assistant"]
                assert got[-2]["tool_call_id"] == "call_w" and got[-1]["content"] == "Written."
                assert got[-1]["run_id"] == request["run_id"]  # one run, resumed after the approval
            assert (tmp_path / "out.txt").read_text() == "hello"


async def test_stop_while_waiting_and_command_answers(gateway_serve: GatewayServe, tmp_path: Path) -> None:
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(ToolCall("write_file", {"path": "x.txt", "content": "x"}, id="call_x")))
        settings = openai_settings(fake, workspace_root=str(tmp_path))
        async with gateway_serve(browser=browser_settings(approvers=["alice"]), **settings) as srv:
            async with gateway_client(srv.url, ALICE_TOKEN) as c:
                await c.attach()
                await c.send({"type": "send", "text": "write x", "client_message_id": "1"})
                await c.expect("approval_request")
                last_seq = max(f["seq"] for f in c.frames if f["type"] == "message")
                await c.send({"type": "stop", "client_message_id": "s"})
                # The run ends with a legal history: the open call gets a result, then a
                # final answer; both reach the tab.
                after = await c.messages_until_answer()
                assert after[0]["seq"] == last_seq + 1
                assert [m["role"] for m in after] == ["tool", "assistant"]
                assert after[0]["tool_call_id"] == "call_x"
                # A session command is answered with a notice (it is not history) …
                await c.send({"type": "send", "text": "/reset", "client_message_id": "r"})
                notice = await c.expect("notice")
                assert "reset" in notice["text"].lower()
                # … and the next message opens a new generation.
                fake.enqueue(text("Fresh start."))
                await c.send({"type": "send", "text": "hello again", "client_message_id": "2"})
                new = await c.expect("new_session")
                assert new["session_id"] != after[0]["session_id"]
                fresh = await c.messages_until_answer()
                assert [m["seq"] for m in fresh] == [1, 2]
