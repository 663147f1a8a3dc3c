"""Mid-run input: the `steer` busy policy and `/stop`, through the whole app."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from sqlalchemy import select

from app.agent.loop import INTERRUPTED_RESULT
from app.agent.provider import ToolSpec
from app.agent.tools import Risk, ToolContext, builtin_tools
from app.db.models import inbox, runs
from app.events import BusyPolicy, InboundEvent
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.openai_server import FakeOpenAI, Reply, ToolCall, calls, text
from tests.pipeline.test_approvals import history_is_legal, only_text, rows
from tests.support.pipeline import accept_elsewhere, wait_elsewhere
from tests.support.timing import eventually
from tests.support.webhook import post_webhook


class BlockingTool:
    """A tool that runs until the test releases it (a slow real-world tool)."""

    spec = ToolSpec("slow", "Takes a while.", {"type": "object", "properties": {}})
    risk = Risk.SAFE

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.cancelled = False

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise
        return json.dumps({"slow": "done"})


async def send(srv: Any, text_: str, *, wait: bool = False, sender: str = "u1") -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c1", "sender_id": sender, "text": text_}, wait=wait
        )
    assert resp.status_code in (200, 202), resp.text
    body: dict[str, Any] = resp.json()
    return body


async def inbox_rows(srv: Any) -> list[dict[str, Any]]:
    async with srv.runtime.engine.connect() as conn:
        return [dict(r) for r in (await conn.execute(select(inbox).order_by(inbox.c.id))).mappings()]


@asynccontextmanager
async def steering_slow_tool(
    serve: ServeApp, answer: str
) -> AsyncIterator[tuple[Any, FakeOpenAI, BlockingTool]]:
    """The app with the `steer` policy and a model that calls the slow tool, then answers."""
    slow = BlockingTool()
    async with FakeOpenAI() as fake:
        fake.enqueue(calls(ToolCall("slow", {}, id="call_slow")), text(answer))
        channel = {"webhook": webhook_settings(busy_policy=BusyPolicy.STEER)}
        async with serve(
            channel_settings=channel, tools=[*builtin_tools(), slow], **openai_settings(fake)
        ) as srv:
            yield srv, fake, slow


async def test_steer_injects_a_message_at_the_next_tool_boundary(serve: ServeApp) -> None:
    async with steering_slow_tool(serve, "Done, and noted the extra wish.") as (srv, fake, slow):
        first = await send(srv, "do the slow thing")
        await asyncio.wait_for(slow.started.wait(), 10)
        second = await send(srv, "and make it blue")
        slow.release.set()
        async with httpx.AsyncClient(timeout=30) as client:
            waited = await client.get(f"{srv.url}/healthz")  # server still serving
        assert waited.status_code == 200

        async def both_done() -> bool:
            return all(r["status"] == "done" for r in await inbox_rows(srv))

        await eventually(both_done)
        ibx = await inbox_rows(srv)
        [run] = await rows(srv, runs)
        await history_is_legal(srv)
    assert len(fake.requests) == 2  # no separate turn for the steering message
    sent = fake.requests[1].messages
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert sent[3]["tool_call_id"] == "call_slow"
    assert sent[4]["content"] == "and make it blue"
    assert [r["event_id"] for r in ibx] == [first["event_id"], second["event_id"]]
    assert {r["run_id"] for r in ibx} == {run["id"]}
    assert run["event_ids"] == [first["event_id"], second["event_id"]]
    assert run["outcome"] == "ok"


async def test_steer_from_another_replica_is_injected_at_the_boundary(serve: ServeApp) -> None:
    """No in-process wake-up: the boundary finds the message through the database.

    On PostgreSQL the statement appending the tool result reads it.
    """
    async with steering_slow_tool(serve, "Done, in blue.") as (srv, fake, slow):
        first = await send(srv, "do the slow thing")
        await asyncio.wait_for(slow.started.wait(), 10)
        steering = InboundEvent.from_text("webhook", "c1", "u1", "make it blue")
        [second] = await accept_elsewhere(srv.runtime.engine, [steering])
        slow.release.set()
        done = await wait_elsewhere(srv.runtime.engine, second.event_id, 10)
        await history_is_legal(srv)
        [run] = await rows(srv, runs)
    assert [r.text for r in done.replies] == ["Done, in blue."]
    assert len(fake.requests) == 2
    sent = fake.requests[1].messages
    assert [(m["role"], m.get("content")) for m in sent if m["role"] == "user"] == [
        ("user", "do the slow thing"),
        ("user", "make it blue"),
    ]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool", "user"]
    assert run["event_ids"] == [first["event_id"], second.event_id]


async def test_without_steer_the_message_waits_for_its_own_turn(serve: ServeApp) -> None:
    slow = BlockingTool()
    async with FakeOpenAI(default=text("ok")) as fake:
        fake.enqueue(calls(ToolCall("slow", {}, id="call_slow")), text("slow done"))
        async with serve(tools=[*builtin_tools(), slow], **openai_settings(fake)) as srv:  # queue
            await send(srv, "do the slow thing")
            await asyncio.wait_for(slow.started.wait(), 10)
            await send(srv, "and make it blue")
            slow.release.set()
            await fake.wait_requests(3)
        assert [m["role"] for m in fake.requests[1].messages] == ["system", "user", "assistant", "tool"]
        assert fake.requests[2].messages[-1]["content"] == "and make it blue"


async def test_stop_cancels_a_slow_model_call(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI() as fake:
        fake.enqueue(Reply(content="too late", hold=hold))
        async with serve(**openai_settings(fake)) as srv:
            first = await send(srv, "think very hard")
            await fake.wait_requests(1)
            stopped = await send(srv, "/stop", wait=True)
            assert only_text(stopped) == "Stopped."
            original = await srv.runtime.waiters.wait_for_replies(first["event_id"], 5)
            history = await history_is_legal(srv)
            [run] = await rows(srv, runs)
            ibx = await inbox_rows(srv)
            hold.set()
    assert [t.text for t in original.replies] == ["Stopped."]
    assert [(m.role, m.content) for m in history] == [("user", "think very hard"), ("assistant", "Stopped.")]
    assert run["outcome"] == "stopped" and run["details"]["stopped_by"] == "u1"
    assert [r["status"] for r in ibx] == ["done", "done"]
    assert len(fake.requests) == 1


async def test_stop_during_a_tool_appends_interrupted_results(serve: ServeApp) -> None:
    slow = BlockingTool()
    async with FakeOpenAI() as fake:
        fake.enqueue(
            calls(ToolCall("slow", {}, id="call_slow"), ToolCall("current_time", {}, id="call_time")),
        )
        async with serve(tools=[*builtin_tools(), slow], **openai_settings(fake)) as srv:
            await send(srv, "do two things")
            await asyncio.wait_for(slow.started.wait(), 10)
            assert only_text(await send(srv, "/stop", wait=True)) == "Stopped."
            history = await history_is_legal(srv)
            [run] = await rows(srv, runs)
    assert slow.cancelled
    assert [(m.role, m.tool_call_id) for m in history] == [
        ("user", None),
        ("assistant", None),
        ("tool", "call_slow"),
        ("tool", "call_time"),
        ("assistant", None),
    ]
    assert history[2].content == history[3].content == INTERRUPTED_RESULT
    assert [c["decision"] for c in run["tool_calls"]] == ["interrupted", "interrupted"]


async def test_stop_from_another_replica_is_found_by_polling(serve: ServeApp) -> None:
    hold = asyncio.Event()
    async with FakeOpenAI() as fake:
        fake.enqueue(Reply(content="too late", hold=hold))
        async with serve(stop_poll_seconds=0.1, **openai_settings(fake)) as srv:
            await send(srv, "think")
            await fake.wait_requests(1)
            # Accepted through another store on the same database: no in-process wake-up.
            stop = InboundEvent.from_text("webhook", "c1", "u1", "/stop")
            [accepted] = await accept_elsewhere(srv.runtime.engine, [stop])
            done = await wait_elsewhere(srv.runtime.engine, accepted.event_id, 10)
            hold.set()
    assert [r.text for r in done.replies] == ["Stopped."]


async def test_stop_with_nothing_running(serve: ServeApp) -> None:
    async with serve() as srv:
        assert only_text(await send(srv, "/stop", wait=True)) == "Nothing is running."


async def test_a_burst_on_one_session_finishes_while_events_wake_the_running_turn(serve: ServeApp) -> None:
    """Every accepted event wakes the running turn's /stop watcher; that must never hang a run
    (regression: `asyncio.wait_for` could swallow the watcher's cancellation on 3.11)."""
    for policy in (BusyPolicy.QUEUE, BusyPolicy.STEER):
        channel = {"webhook": webhook_settings(busy_policy=policy)}
        async with serve(channel_settings=channel, stop_poll_seconds=0.05) as srv:  # offline provider
            texts = [f"what time is it? #{i}" if i % 2 else f"hello {i}" for i in range(24)]
            posted = await asyncio.gather(*(send(srv, t) for t in texts))
            for body in posted:
                done = await srv.runtime.waiters.wait_for_replies(body["event_id"], 30)
                assert done.done, (policy, body)
            await history_is_legal(srv)
