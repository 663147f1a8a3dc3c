"""DingTalk membership events over Stream (docs/events.md): `chat_add_member`,
`chat_remove_member` and `chat_quit` EVENT frames become joined / left events of the group;
with DINGTALK_WELCOME_TEXT / DINGTALK_FAREWELL_TEXT the robot says them in the group. The
real app, the fake DingTalk's Stream (EVENT frames as DingTalk sends them) with the official
SDK inside the app."""

from __future__ import annotations

import json
from typing import Any

from app.db.models import inbox
from tests.channels.dingtalk.support import dingtalk_settings
from tests.channels.support import count, wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk

GROUP = "cidGROUP001=="


def _chat_event(kind: str, users: list[str] | None, *, operator: str = "manager1") -> dict[str, Any]:
    """A 群会话事件 body as DingTalk publishes it."""
    body: dict[str, Any] = {
        "Operator": operator,
        "OpenConversationId": GROUP,
        "CorpId": "dingcorp",
        "EventType": kind,
        "OperatorUnionId": "union-op",
        "TimeStamp": 1640601921836,
        "ChatId": "chat691a41db53b100115bec3603472d78a9",
    }
    if users is not None:
        body["UserId"] = users
        body["UnionId"] = [f"union-{u}" for u in users]
    return body


def _said(fake: FakeDingTalk) -> list[str]:
    return [json.loads(c.body["msgParam"])["content"] for c in fake.calls_of(dt.GROUP_SEND)]


async def test_members_joining_and_leaving_are_welcomed_and_seen_off_once(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        settings = dingtalk_settings(
            fake, mode="stream", welcome_text="Welcome, {name}!", farewell_text="Goodbye, {name}."
        )
        async with serve(channel_settings={"dingtalk": settings}) as srv:
            await fake.wait_for_socket()
            added = _chat_event("chat_add_member", ["u-ann", "u-bob"])
            await fake.wait_for_ack(await fake.push_event("chat_add_member", added, "ev-1"))
            await fake.wait_for(lambda: len(fake.calls_of(dt.GROUP_SEND)) == 2)
            # The same event delivered again: acknowledged, stored once.
            await fake.wait_for_ack(await fake.push_event("chat_add_member", added, "ev-1"))
            removed = _chat_event("chat_remove_member", ["u-bob"])
            await fake.wait_for_ack(await fake.push_event("chat_remove_member", removed, "ev-2"))
            quit_ = _chat_event("chat_quit", None, operator="u-ann")
            await fake.wait_for_ack(await fake.push_event("chat_quit", quit_, "ev-3"))
            # Other events (and a group event naming no conversation) are acknowledged, not stored.
            other = {"EventType": "user_add_org", "UserId": ["u-new"], "CorpId": "dingcorp"}
            await fake.wait_for_ack(await fake.push_event("user_add_org", other, "ev-4"))
            nameless = {**_chat_event("chat_add_member", ["u-cat"]), "OpenConversationId": None}
            await fake.wait_for_ack(await fake.push_event("chat_add_member", nameless, "ev-5"))
            await fake.wait_for(lambda: len(fake.calls_of(dt.GROUP_SEND)) == 4)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 4
    [opened] = fake.calls_of(dt.OPEN_PATH)
    assert {"type": "EVENT", "topic": "*"} in opened.body["subscriptions"]
    assert sorted(_said(fake)[:2]) == ["Welcome, u-ann!", "Welcome, u-bob!"]
    assert _said(fake)[2:] == ["Goodbye, u-bob.", "Goodbye, u-ann."]
    assert {c.body["openConversationId"] for c in fake.calls_of(dt.GROUP_SEND)} == {GROUP}


async def test_without_a_welcome_or_farewell_no_events_are_asked_for(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        async with serve(channel_settings={"dingtalk": dingtalk_settings(fake, mode="stream")}):
            await fake.wait_for_socket()
    [opened] = fake.calls_of(dt.OPEN_PATH)
    assert opened.body["subscriptions"] == [{"type": "CALLBACK", "topic": dt.ROBOT_TOPIC}]
