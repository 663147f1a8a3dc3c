"""Stream mode: the official SDK over a WebSocket the app opens; ACK only after the inbox commit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence

import httpx

from app.channel import AcceptResult, ChannelContext, WaitResult
from app.connections import ConnectionRun, LocalConnections, fingerprint
from app.db.models import inbox, outbox
from app.events import InboundEvent
from channels.dingtalk import DingTalkChannel
from tests.channels.dingtalk.support import dingtalk_settings
from tests.channels.support import count, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk
from tests.support.timing import scaled


async def test_stream_message_is_acknowledged_after_storing_answered_and_redelivery_is_once(
    serve: ServeApp,
) -> None:
    async with FakeDingTalk() as fake:
        settings = dingtalk_settings(fake, mode="stream")
        async with serve(channel_settings={"dingtalk": settings}) as srv:
            await fake.wait_for_socket()
            webhook = fake.webhook_url
            message = dt.robot_message("over the stream", group=True, webhook=webhook)
            frame = await fake.push_callback(message)
            ack = await fake.wait_for_ack(frame)
            assert ack["code"] == 200
            assert await count(srv.runtime, inbox) == 1  # stored before the ACK was sent
            assert json.loads(json.loads(ack["data"])["response"])["session_key"] == "dingtalk:cidGROUP001=="
            # DingTalk redelivers the same message in a new frame: acknowledged, stored once.
            again = await fake.push_callback(message)
            assert json.loads(json.loads((await fake.wait_for_ack(again))["data"])["response"])["duplicate"]
            # The system ping is answered with its opaque value.
            ping = await fake.push_ping("opaque-1")
            assert json.loads((await fake.wait_for_ack(ping))["data"]) == {"opaque": "opaque-1"}
            # A group message without a mention is acknowledged and not stored.
            chatter = await fake.push_callback(dt.robot_message("chatter", group=True, at_me=False))
            await fake.wait_for_ack(chatter)
            # A malformed message is acknowledged too (a redelivery would not help).
            broken = await fake.push_callback({"msgId": "broken"})
            assert "refused" in json.loads((await fake.wait_for_ack(broken))["data"])["response"]
            [hook] = await fake.wait_for_delivered(1)
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
            # With DINGTALK_MODE=stream the HTTP callback still verifies its signature.
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await client.post(
                    f"{srv.url}/channels/dingtalk",
                    json=message,
                    headers=dt.signed_headers(secret="forged"),
                )
                assert resp.status_code == 401
    [opened] = fake.calls_of(dt.OPEN_PATH)
    assert opened.body["subscriptions"] == [{"type": "CALLBACK", "topic": dt.ROBOT_TOPIC}]
    assert hook.path == dt.WEBHOOK_PATH
    assert hook.body["text"]["content"] == "You said: over the stream"


async def test_stream_reconnects_after_disconnect_and_group_reply_goes_to_the_conversation(
    serve: ServeApp,
) -> None:
    async with FakeDingTalk() as fake:
        settings = dingtalk_settings(fake, mode="stream")
        async with serve(channel_settings={"dingtalk": settings}) as srv:
            await fake.wait_for_socket()
            await fake.push_disconnect()  # DingTalk asks the client to reconnect
            await fake.wait_for(lambda: len(fake.tickets_used) == 2)
            await fake.wait_for_socket()
            frame = await fake.push_callback(dt.robot_message("after reconnect", group=True))
            await fake.wait_for_ack(frame)
            await wait_outbox_final(srv.runtime)
    [sent] = fake.calls_of(dt.GROUP_SEND)
    assert sent.body["openConversationId"] == "cidGROUP001=="
    assert json.loads(sent.body["msgParam"]) == {"content": "You said: after reconnect"}
    assert fake.tickets_used == ["ticket-1", "ticket-2"]


async def test_stream_runs_under_the_connection_holder_and_acks_only_after_accept_returned() -> None:
    """The channel opens the stream only through `hold_connection`, and holds the ACK back
    until `accept` (the inbox commit) returned; a failed accept leaves the frame unacknowledged."""
    held: list[str] = []
    entered, release = asyncio.Event(), asyncio.Event()
    accepted: list[InboundEvent] = []
    fail_next = [False]

    async def accept(events: Sequence[InboundEvent]) -> list[AcceptResult]:
        if fail_next[0]:
            fail_next[0] = False
            raise ConnectionError("database unreachable")
        entered.set()
        await release.wait()
        accepted.extend(events)
        return [AcceptResult(event_id=e.event_id, session_key=e.session_key) for e in events]

    async def no_wait(event_id: str, timeout: float) -> WaitResult:
        raise AssertionError("Stream mode never waits for replies")

    async def hold_connection(name: str, run: ConnectionRun) -> None:
        held.append(name)
        await LocalConnections(retry_seconds=0.05).hold_connection(name, run)

    async with FakeDingTalk() as fake, httpx.AsyncClient(timeout=30) as http:
        channel = DingTalkChannel(
            dingtalk_settings(fake, mode="stream"), ChannelContext(accept, no_wait, http, hold_connection)
        )
        await channel.start()
        try:
            await fake.wait_for_socket()
            frame = await fake.push_callback(dt.robot_message("wait for me"))
            await asyncio.wait_for(entered.wait(), scaled(15))
            # A ping answered on the same socket is the barrier: an ACK sent before (or
            # while) accept ran would have arrived ahead of the ping's.
            await fake.wait_for_ack(await fake.push_ping("while-accepting"))
            assert fake.ack_for(frame) is None  # accept has not returned yet
            release.set()
            await fake.wait_for_ack(frame)
            assert [e.text for e in accepted] == ["wait for me"]
            fail_next[0] = True
            lost = await fake.push_callback(dt.robot_message("not stored"))
            ping = await fake.push_ping("after-failure")
            await fake.wait_for_ack(ping)  # the connection keeps serving
            assert fake.ack_for(lost) is None  # no ACK: DingTalk redelivers it
        finally:
            await channel.stop()
    assert held == [f"dingtalk:{fingerprint(dt.CLIENT_ID)}"]


class _OneHolderAtATime:
    """Two replicas' view of one connection: whoever holds the lock runs it; a replica that
    dies (its task cancelled) lets the other take over. Stands in for the database lease."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.holders: list[str] = []

    def for_replica(self, replica: str) -> Callable[[str, ConnectionRun], Awaitable[None]]:
        async def hold_connection(name: str, run: ConnectionRun) -> None:
            async with self._lock:
                self.holders.append(replica)
                await LocalConnections(retry_seconds=0.05).hold_connection(name, run)

        return hold_connection


async def test_two_replicas_one_stream_and_a_takeover_loses_nothing_and_repeats_nothing(
    serve: ServeApp,
) -> None:
    holder = _OneHolderAtATime()
    async with FakeDingTalk() as fake:
        # The served app stores and answers; its own DingTalk channel does not hold a stream.
        async with serve(channel_settings={"dingtalk": dingtalk_settings(fake, mode="http")}) as srv:
            context = srv.runtime.context_for("dingtalk")
            replicas = [
                DingTalkChannel(
                    dingtalk_settings(fake, mode="stream"),
                    ChannelContext(
                        context.accept, context.wait_for_replies, context.http, holder.for_replica(name)
                    ),
                )
                for name in ("a", "b")
            ]
            for replica in replicas:
                await replica.start()
            try:
                await fake.wait_for_socket()
                await asyncio.sleep(0.3)
                assert fake.connected == 1
                assert holder.holders == ["a"]
                first = dt.robot_message("before the takeover")
                await fake.wait_for_ack(await fake.push_callback(first))
                await replicas[0].stop()  # the owner dies
                await fake.wait_for(lambda: len(fake.tickets_used) == 2 and fake.connected == 1)
                assert holder.holders == ["a", "b"]
                # DingTalk redelivers what it is unsure of, and sends on.
                await fake.wait_for_ack(await fake.push_callback(first))
                await fake.wait_for_ack(await fake.push_callback(dt.robot_message("after the takeover")))
                await wait_outbox_final(srv.runtime, 2)
                await wait_inbox_done(srv.runtime)
                assert await count(srv.runtime, inbox) == 2
                assert await count(srv.runtime, outbox) == 2
            finally:
                for replica in replicas:
                    await replica.stop()
    assert sorted(json.loads(c.body["msgParam"])["content"] for c in fake.delivered()) == [
        "You said: after the takeover",
        "You said: before the takeover",
    ]
