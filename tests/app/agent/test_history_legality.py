"""Hypothesis: random runs, cut at any point and resumed, always leave a legal history.

Each example plays a conversation of several turns. A turn's run makes a random number
of tool-call groups before answering; some attempts are cut short (the worker task is
cancelled right after the N-th commit it announced, i.e. at an arbitrary point of the
run, like a crash) and the turn is then resumed by a new lease holder, as after a
restart. The real turn handler, run loop, store and inbox run on the real database.

Checked after every turn: every request the model received was a legal provider input,
the stored history is legal, each user message is stored once, and each event got
exactly one final reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from app.agent.provider import ProviderReply, ToolSpec
from app.agent.tools import Risk, ToolContext
from app.db.models import approvals, inbox, outbox, utcnow
from app.events import InboundEvent
from app.migrate import upgrade
from app.pipeline.approvals import timeout_events
from app.pipeline.builtin_commands import BuiltinCommands
from app.pipeline.commands import CommandRegistry
from app.pipeline.feed import SessionFeed
from app.pipeline.handling import Handler
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import WindowLimits
from app.runtime import Runtime
from app.sessions import lease as leases
from app.sessions import queries
from app.sessions.messages import ChatMessage, tool_call
from app.sessions.window import is_legal_provider_input
from tests.conftest import make_settings, webhook_settings

_ids = itertools.count()

# Cancelling a run while it opened a connection once left pooled SQLite connections for
# the garbage collector (tests/app/db/test_cancelled_connect.py): any such warning fails.
pytestmark = pytest.mark.filterwarnings(
    "error::sqlalchemy.exc.SAWarning", "error::pytest.PytestUnraisableExceptionWarning"
)


def cutting_handler(runtime: Runtime, bus: Any, *, max_messages: int) -> Handler:
    """The runtime's pipeline below the scheduler, telling `bus` of every commit, with
    room for many cut attempts."""
    turns = TurnRunner(
        runtime.store,
        runtime.runner,
        runtime.replies,
        runtime.midrun,
        profiles=runtime.agents,
        models=runtime.models,
        limits=WindowLimits(max_messages=max_messages, max_tokens=None),
        feed=SessionFeed(bus),
        channel_settings=runtime.channel_settings,
    )
    commands = CommandRegistry()
    for command in BuiltinCommands(runtime.store, runtime.replies, turns, commands).commands():
        commands.add(command)
    return Handler(
        runtime.store,
        commands,
        turns,
        runtime.policies,
        runtime.replies,
        max_attempts=10,
        channel_settings=runtime.channel_settings,
    )


@dataclass
class PlannedProvider:
    """Makes `plans[user text]` tool-call groups (of the given sizes), then answers."""

    plans: dict[str, list[int]] = field(default_factory=dict)
    risky: set[str] = field(default_factory=set)  # texts whose first call needs approval
    requests: list[list[ChatMessage]] = field(default_factory=list)
    name: str = "planned"

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        window = [m for m in messages if m.role != "system"]
        self.requests.append(window)
        await asyncio.sleep(0)  # a model call is a place where a run can be cut
        last_user = max(i for i, m in enumerate(window) if m.role == "user")
        text = window[last_user].content or ""
        done = sum(1 for m in window[last_user:] if m.role == "assistant" and m.tool_calls)
        plan = self.plans.get(text, [])
        if done < len(plan):
            names = ["echo"] * plan[done]
            if text in self.risky and done == 0:
                names[0] = "risky_echo"
            return ProviderReply(
                content=None,
                tool_calls=tuple(tool_call(f"call_{next(_ids)}", n, {"n": k}) for k, n in enumerate(names)),
            )
        return ProviderReply(content=f"answer to {text}")

    async def aclose(self) -> None:
        return None


class EchoTool:
    spec = ToolSpec("echo", "Echoes.", {"type": "object", "properties": {"n": {"type": "integer"}}})
    risk = Risk.SAFE

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        await asyncio.sleep(0)
        return json.dumps(arguments)


class RiskyEchoTool(EchoTool):
    spec = ToolSpec("risky_echo", "Echoes, riskily.", {"type": "object", "properties": {}})
    risk = Risk.RISKY


class CuttingBus:
    """A session bus that cancels the worker right after its N-th announced commit."""

    def __init__(self) -> None:
        self.cut_after: int | None = None
        self.count = 0
        self.victim: asyncio.Task[Any] | None = None

    async def publish(self, key: str, event: dict[str, Any], *, remote: bool = True) -> None:
        self.count += 1
        if self.cut_after is not None and self.count >= self.cut_after and self.victim is not None:
            self.victim.cancel()

    def subscribe(self, key: str, maxsize: int = 1000) -> Any:
        raise NotImplementedError

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None


turns = st.lists(
    st.tuples(
        st.lists(st.integers(1, 3), max_size=3),  # tool-call groups and their sizes
        st.lists(st.integers(1, 12), max_size=2),  # attempts cut after N commits
    ),
    min_size=1,
    max_size=4,
)

_migrated: set[str] = set()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(conversation=turns)
async def test_cut_and_resumed_runs_leave_a_legal_history(
    db_url: str, conversation: list[tuple[list[int], list[int]]]
) -> None:
    if db_url not in _migrated:
        await upgrade(db_url)
        _migrated.add(db_url)
    provider = PlannedProvider()
    runtime = Runtime(
        make_settings(db_url, auto_migrate=False),
        channel_settings={"webhook": webhook_settings()},
        provider=provider,
        tools=[EchoTool()],
    )
    # This test is the only worker: events go straight to the store, no scheduler runs.
    bus = CuttingBus()
    handler = cutting_handler(runtime, bus, max_messages=30)
    chat = uuid.uuid4().hex
    owner = f"worker-{chat}"
    try:
        for index, (plan, cuts) in enumerate(conversation):
            text = f"message {index}"
            provider.plans[text] = plan
            event = InboundEvent.from_text("webhook", chat, "u1", text)
            await runtime.store.accept([event])
            for cut in [*cuts, None]:
                lease = await leases.acquire(runtime.engine, event.session_key, owner, 30)
                assert lease is not None
                rows = await runtime.store.next_rows(event.session_key, limit=1)
                if not rows:
                    break
                bus.count, bus.cut_after = 0, cut
                task = asyncio.create_task(handler.handle(lease, rows))
                bus.victim = task
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            assert await runtime.store.next_rows(event.session_key, 1) == []

            for request in provider.requests:
                assert is_legal_provider_input(request), [(m.role, m.tool_call_id) for m in request]
            session = await queries.current_session(runtime.engine, event.session_key)
            assert session is not None
            history = await runtime.sessions.all_messages(session["id"])
            assert is_legal_provider_input(history), [(m.role, m.tool_call_id) for m in history]
            users = [m.content for m in history if m.role == "user"]
            assert users == [f"message {i}" for i in range(index + 1)]
            async with runtime.engine.connect() as conn:
                replies = (
                    await conn.execute(
                        select(func.count()).select_from(outbox).where(outbox.c.event_id == event.event_id)
                    )
                ).scalar_one()
                status = (
                    await conn.execute(select(inbox.c.status).where(inbox.c.event_id == event.event_id))
                ).scalar_one()
            assert (replies, status) == (1, "done")
            assert history[-1].role == "assistant" and history[-1].content == f"answer to {text}"
    finally:
        await runtime.engine.dispose()


EXTRAS = (None, "stop", "steer", "approve", "deny", "supersede", "stop_waiting", "timeout")
rich_turns = st.lists(
    st.tuples(
        st.lists(st.integers(1, 3), max_size=2),
        st.lists(st.integers(1, 14), max_size=2),
        st.sampled_from(EXTRAS),
    ),
    min_size=1,
    max_size=4,
)


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(conversation=rich_turns)
async def test_stop_steer_and_approvals_with_cuts_leave_a_legal_history(
    db_url: str, conversation: list[tuple[list[int], list[int], str | None]]
) -> None:
    """/stop, steered messages and approvals (approve, deny, new message, /stop, timeout),
    each attempt possibly cut: every request and the final history are legal."""
    if db_url not in _migrated:
        await upgrade(db_url)
        _migrated.add(db_url)
    provider = PlannedProvider()
    channel = webhook_settings(busy_policy="steer", approve_own_requests_in_direct=True)
    runtime = Runtime(
        make_settings(db_url, auto_migrate=False),
        channel_settings={"webhook": channel},
        provider=provider,
        tools=[EchoTool(), RiskyEchoTool()],
    )
    bus = CuttingBus()
    handler = cutting_handler(runtime, bus, max_messages=40)
    chat = uuid.uuid4().hex
    key = InboundEvent.from_text("webhook", chat, "u1", "").session_key
    owner = f"worker-{chat}"
    expected_users: list[str] = []

    async def say(*texts: str) -> None:
        await runtime.store.accept([InboundEvent.from_text("webhook", chat, "u1", t) for t in texts])
        expected_users.extend(t for t in texts if not t.startswith("/"))

    async def drain(cuts: list[int]) -> None:
        pending_cuts = list(cuts)
        for _ in range(40):
            lease = await leases.acquire(runtime.engine, key, owner, 30)
            assert lease is not None
            rows = await runtime.store.next_rows(key, limit=1)
            if not rows:
                return
            bus.count, bus.cut_after = 0, (pending_cuts.pop(0) if pending_cuts else None)
            task = asyncio.create_task(handler.handle(lease, rows))
            bus.victim = task
            with contextlib.suppress(asyncio.CancelledError):
                await task
        raise AssertionError("the inbox did not drain")

    async def pending_approval() -> int | None:
        async with runtime.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(approvals.c.id).where(
                        approvals.c.session_key == key, approvals.c.status == "pending"
                    )
                )
            ).first()
        return None if row is None else int(row[0])

    try:
        for index, (plan, cuts, extra) in enumerate(conversation):
            text = f"message {index}"
            if extra in ("approve", "deny", "supersede", "stop_waiting", "timeout"):
                plan = plan or [1]
                provider.risky.add(text)
            provider.plans[text] = plan
            if extra == "stop":
                await say(text, "/stop")
            elif extra == "steer":
                provider.plans[f"steer {index}"] = []
                await say(text, f"steer {index}")
            else:
                await say(text)
            await drain(cuts)
            number = await pending_approval()
            if number is not None:
                if extra == "approve":
                    await say(f"/approve {number}")
                elif extra == "deny":
                    await say(f"/deny {number}")
                elif extra == "supersede":
                    provider.plans[f"new {index}"] = []
                    await say(f"new {index}")
                elif extra == "stop_waiting":
                    await say("/stop")
                else:
                    async with runtime.engine.connect() as conn:
                        expired = await timeout_events(conn, utcnow() + timedelta(days=1))
                    await runtime.store.accept(expired)
                await drain(cuts)
            assert await pending_approval() is None
            assert await runtime.store.next_rows(key, 1) == []

            for request in provider.requests:
                assert is_legal_provider_input(request), [(m.role, m.tool_call_id) for m in request]
            session = await queries.current_session(runtime.engine, key)
            assert session is not None
            history = await runtime.sessions.all_messages(session["id"])
            assert is_legal_provider_input(history), [(m.role, m.tool_call_id) for m in history]
            assert [m.content for m in history if m.role == "user"] == expected_users
            assert history[-1].role == "assistant" and not history[-1].tool_calls
            async with runtime.engine.connect() as conn:
                statuses = {
                    r[0] for r in await conn.execute(select(inbox.c.status).where(inbox.c.session_key == key))
                }
            assert statuses == {"done"}
    finally:
        await runtime.engine.dispose()
