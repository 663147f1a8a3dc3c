"""The agent's reminder tools: jobs bound to the current session, and only to it."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import select

from app.agent.provider import ProviderReply, ToolSpec
from app.agent.reminder import reminder_tools
from app.agent.tools import ToolContext, ToolRegistry
from app.db.models import sessions, utcnow
from app.scheduling import JobStore, Target
from app.sessions.messages import ChatMessage, tool_call
from channels.cron import CronSettings
from tests.conftest import WEBHOOK_SECRET, ServeApp, webhook_settings
from tests.fakes.http_receiver import HttpReceiver
from tests.support.webhook import post_webhook

NOW = datetime(2026, 12, 2, 11, 0, tzinfo=UTC)


def context(session_key: str, channel: str, chat_id: str, thread_id: str | None = None) -> ToolContext:
    async def count() -> int:
        return 0

    return ToolContext(
        session_id=1,
        session_key=session_key,
        channel=channel,
        chat_id=chat_id,
        sender_id="alice",
        thread_id=thread_id,
        message_count=count,
    )


async def call(registry: ToolRegistry, ctx: ToolContext, name: str, **arguments: Any) -> dict[str, Any]:
    raw = await registry.execute(tool_call("call_1", name, arguments), ctx)
    result: dict[str, Any] = json.loads(raw)
    return result


async def test_schedule_binds_the_job_to_the_current_session_and_chat(jobs: JobStore) -> None:
    tools = ToolRegistry(reminder_tools(jobs, clock=lambda: NOW))
    ctx = context("telegram:42:7", "telegram", "42", thread_id="7")
    once = await call(tools, ctx, "schedule_reminder", message="call mum", in_seconds=600)
    daily = await call(
        tools, ctx, "schedule_reminder", message="stand-up", cron="0 9 * * 1-5", timezone="Asia/Shanghai"
    )
    at = await call(
        tools, ctx, "schedule_reminder", message="party", at="2026-12-24T18:00", timezone="Europe/Berlin"
    )

    job = await jobs.get(once["scheduled"]["id"])
    assert job is not None
    assert job.source_session_key == "telegram:42:7"
    assert job.target == Target("telegram", "42", "7")
    assert job.next_fire_at == NOW + timedelta(minutes=10)
    assert job.created_by == "telegram:alice"
    assert daily["scheduled"]["next_fire_at"] == "2026-12-03T01:00:00+00:00"
    assert at["scheduled"]["next_fire_at"] == "2026-12-24T17:00:00+00:00"


async def test_bad_requests_come_back_to_the_model_as_errors(jobs: JobStore) -> None:
    tools = ToolRegistry(reminder_tools(jobs, clock=lambda: NOW, max_active=2))
    ctx = context("webhook:c", "webhook", "c")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"message": "x"}, "exactly one"),
        ({"message": "x", "in_seconds": 5, "cron": "* * * * *"}, "exactly one"),
        ({"message": "x", "cron": "* * * * * *"}, "5 fields"),
        ({"message": "x", "cron": "0 25 * * *"}, "invalid cron"),
        ({"message": "x", "cron": "0 9 * * *", "timezone": "Moon/Base"}, "time zone"),
        ({"message": "x", "at": "2020-01-01T00:00"}, "past"),
        ({"message": "x", "in_seconds": 0}, "in_seconds"),
        ({"message": "", "in_seconds": 5}, "message"),
    ]
    for arguments, reason in cases:
        result = await call(tools, ctx, "schedule_reminder", **arguments)
        assert reason in result["error"], (arguments, result)
    assert await jobs.list_jobs() == []
    for _ in range(2):
        assert "scheduled" in await call(tools, ctx, "schedule_reminder", message="x", in_seconds=60)
    over = await call(tools, ctx, "schedule_reminder", message="x", in_seconds=60)
    assert "already has 2 active reminders" in over["error"]


async def test_a_session_cannot_see_or_cancel_another_sessions_reminders(jobs: JobStore) -> None:
    tools = ToolRegistry(reminder_tools(jobs, clock=lambda: NOW))
    alice = context("webhook:alice", "webhook", "alice")
    bob = context("webhook:bob", "webhook", "bob")
    mine = (await call(tools, alice, "schedule_reminder", message="alice's", in_seconds=60))["scheduled"]
    theirs = (await call(tools, bob, "schedule_reminder", message="bob's", in_seconds=60))["scheduled"]

    listed = await call(tools, alice, "list_reminders")
    assert [r["id"] for r in listed["reminders"]] == [mine["id"]]
    assert listed["reminders"][0]["message"] == "alice's"

    refused = await call(tools, alice, "cancel_reminder", id=theirs["id"])
    missing = await call(tools, alice, "cancel_reminder", id=999_999)
    # The same answer as for a job that does not exist: nothing about other sessions leaks.
    assert refused["error"] == f"this conversation has no reminder with id {theirs['id']}"
    assert missing["error"] == "this conversation has no reminder with id 999999"
    assert await jobs.get(theirs["id"]) is not None

    assert await call(tools, alice, "cancel_reminder", id=mine["id"]) == {"cancelled": mine["id"]}
    assert (await call(tools, alice, "list_reminders"))["reminders"] == []
    assert [r["id"] for r in (await call(tools, bob, "list_reminders"))["reminders"]] == [theirs["id"]]


async def test_inside_a_fired_reminder_new_reminders_go_to_the_original_chat(jobs: JobStore) -> None:
    tools = ToolRegistry(reminder_tools(jobs, clock=lambda: NOW))
    first = await jobs.create(
        prompt="p",
        source_session_key="webhook:c",
        target=Target("webhook", "c", "t"),
        run_at=NOW + timedelta(1),
        now=NOW,  # the test's clock, not today's: NOW + 1 day is in the past from 2026-12-03 on
    )
    in_fire = context("webhook:c", "cron", str(first.id))  # what a cron turn's tools see
    made = await call(tools, in_fire, "schedule_reminder", message="again", in_seconds=60)
    job = await jobs.get(made["scheduled"]["id"])
    assert job is not None and job.target == Target("webhook", "c", "t")
    # A cron turn of another session cannot borrow that job's target.
    stranger = context("webhook:other", "cron", str(first.id))
    assert (
        "cannot tell"
        in (await call(tools, stranger, "schedule_reminder", message="x", in_seconds=60))["error"]
    )


class ReminderModel:
    """Plays a model that uses the reminder tools (an external system, scripted)."""

    name = "scripted"

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        last = messages[-1]
        if last.role == "tool":
            return ProviderReply(content=f"{last.name} -> {last.content}")
        text = last.content or ""
        wanted = re.fullmatch(r"remind me in (\d+)s: (.+)", text)
        if wanted and "schedule_reminder" in {t.name for t in tools}:
            args = {"in_seconds": int(wanted.group(1)), "message": wanted.group(2)}
            return ProviderReply(
                content=None, tool_calls=(tool_call(f"c{last.seq}", "schedule_reminder", args),)
            )
        return ProviderReply(content=f"Reminder: {text}")

    async def aclose(self) -> None:
        return None


def webhook_and_cron(callback_url: str) -> dict[str, Any]:
    """The webhook channel (replies to `callback_url`) and a fast-ticking cron channel."""
    return {
        "webhook": webhook_settings(callback_url=callback_url),
        "cron": CronSettings(_env_file=None, tick_seconds=0.05),  # type: ignore[call-arg]
    }


async def test_a_reminder_asked_for_in_a_chat_comes_back_to_that_chat(serve: ServeApp) -> None:
    async with HttpReceiver() as receiver:
        channels = webhook_and_cron(receiver.url)
        async with (
            serve(channel_settings=channels, provider=ReminderModel()) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            asked = await post_webhook(
                client,
                srv.url,
                WEBHOOK_SECRET,
                {"chat_id": "c9", "sender_id": "u", "text": "remind me in 1s: drink water"},
            )
            assert asked.status_code == 202
            [confirmation] = await receiver.wait_for(1)
            assert "schedule_reminder ->" in json.loads(confirmation.body)["text"]
            [job] = await srv.runtime.jobs.list_jobs()
            assert job.source_session_key == "webhook:c9" and job.target == Target("webhook", "c9")
            started = utcnow()
            delivered = await receiver.wait_for(2)
            reminder = json.loads(delivered[1].body)
            assert reminder["text"] == "Reminder: drink water"
            assert reminder["chat_id"] == "c9" and reminder["session_key"] == "webhook:c9"
            assert utcnow() - started < timedelta(seconds=5)
            await asyncio.sleep(0.2)
            assert len(receiver.received) == 2


async def test_a_reminder_firing_after_the_conversation_ended_opens_it_on_its_own_channel(
    serve: ServeApp,
) -> None:
    """The generation a cron fire opens belongs to the chat's channel (lifecycle, dashboard), not `cron`."""
    async with HttpReceiver() as receiver:
        channels = webhook_and_cron(receiver.url)
        async with (
            serve(channel_settings=channels, provider=ReminderModel()) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            for text in ("remind me in 2s: stretch", "/end"):
                sent = await post_webhook(
                    client, srv.url, WEBHOOK_SECRET, {"chat_id": "c7", "sender_id": "u", "text": text}
                )
                assert sent.status_code == 202
                await receiver.wait_for(len(receiver.received) + 1)
            for _ in range(100):
                texts = [json.loads(r.body)["text"] for r in receiver.received]
                if "Reminder: stretch" in texts:
                    break
                await asyncio.sleep(0.1)
            assert "Reminder: stretch" in texts
            async with srv.runtime.engine.connect() as conn:
                generations = (
                    await conn.execute(
                        select(sessions.c.generation, sessions.c.channel)
                        .where(sessions.c.key == "webhook:c7")
                        .order_by(sessions.c.generation)
                    )
                ).all()
            assert [tuple(g) for g in generations] == [(1, "webhook"), (2, "webhook")]
