"""Fan-out to several connections of one key, resume after reconnect, slow clients."""

from __future__ import annotations

import asyncio
import secrets
import time

from websockets.exceptions import ConnectionClosed

from tests.gateway.conftest import ALICE_TOKEN, GatewayServe, gateway_client
from tests.support.timing import scaled


async def test_two_connections_on_one_key_both_receive(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as tab1, gateway_client(srv.url, ALICE_TOKEN) as tab2:
            await tab1.attach("web:alice")
            await tab2.attach("web:alice")
            await tab1.send({"type": "send", "text": "what time is it", "client_message_id": "t1-1"})
            seen1 = await tab1.messages_until_answer()
            seen2 = await tab2.messages_until_answer()
            assert [(m["seq"], m["role"]) for m in seen1] == [
                (1, "user"),
                (2, "assistant"),
                (3, "tool"),
                (4, "assistant"),
            ]
            assert seen1 == seen2
            # The other tab talks; the first one sees it.
            await tab2.send({"type": "send", "text": "hello from tab 2", "client_message_id": "t2-1"})
            got = await tab1.messages_until_answer()
            assert [m["content"] for m in got] == ["hello from tab 2", "You said: hello from tab 2"]
            assert [m["seq"] for m in got] == [5, 6]


async def test_reconnect_gets_exactly_the_missed_messages(gateway_serve: GatewayServe) -> None:
    async with gateway_serve() as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as other:
            await other.attach("web:alice")
            async with gateway_client(srv.url, ALICE_TOKEN) as tab:
                await tab.attach("web:alice")
                await other.send({"type": "send", "text": "first", "client_message_id": "1"})
                seen = await tab.messages_until_answer()
                await other.messages_until_answer()
                session_id, last_seq = seen[-1]["session_id"], seen[-1]["seq"]
            assert last_seq == 2
            # While the tab is away the session goes on.
            await other.send({"type": "send", "text": "what time is it", "client_message_id": "2"})
            await other.messages_until_answer()
            await other.send({"type": "send", "text": "third", "client_message_id": "3"})
            await other.messages_until_answer()
            async with gateway_client(srv.url, ALICE_TOKEN) as tab:
                ready = await tab.attach("web:alice", session_id=session_id, last_seq=last_seq)
                assert ready["truncated"] is False
                assert [m["seq"] for m in ready["messages"]] == [3, 4, 5, 6, 7, 8]
                assert ready["messages"][0]["content"] == "what time is it"
                assert ready["last_seq"] == 8
                # Then live messages, continuing the sequence without a repeat.
                await other.send({"type": "send", "text": "fourth", "client_message_id": "4"})
                live = await tab.messages_until_answer()
                assert [m["seq"] for m in live] == [9, 10]
            # Without last_seq: recent history; with a stale generation: recent history, marked.
            async with gateway_client(srv.url, ALICE_TOKEN) as tab:
                ready = await tab.attach("web:alice")
                assert [m["seq"] for m in ready["messages"]] == list(range(1, 11))
                ready = await tab.attach("web:alice", session_id=session_id + 100, last_seq=3)
                assert ready["truncated"] is True and ready["messages"][-1]["seq"] == 10


async def test_resume_while_the_session_is_busy_has_no_gaps_or_repeats(gateway_serve: GatewayServe) -> None:
    """Reconnect again and again while messages are being committed: the seqs a client
    sees over all its connections are exactly 1..N, each once."""
    async with gateway_serve(offline_latency_ms=40) as srv:
        async with gateway_client(srv.url, ALICE_TOKEN) as talker:
            await talker.attach("web:alice")
            for i in range(6):
                await talker.send(
                    {"type": "send", "text": f"what time is it {i}", "client_message_id": f"q{i}"}
                )
            seen: list[int] = []
            session_id = None
            deadline = time.monotonic() + scaled(30)
            while time.monotonic() < deadline and len(seen) < 24:
                async with gateway_client(srv.url, ALICE_TOKEN) as tab:
                    extra = {"session_id": session_id, "last_seq": seen[-1]} if seen else {}
                    ready = await tab.attach("web:alice", **extra)
                    seen += [m["seq"] for m in ready["messages"]]
                    if ready["session_id"] is not None:
                        session_id = ready["session_id"]
                    # Read a few live frames, then drop the connection mid-stream.
                    try:
                        for _ in range(3):
                            frame = await tab.expect("message", timeout=0.3)
                            seen.append(frame["seq"])
                            session_id = frame["session_id"]
                    except TimeoutError:
                        pass
            assert seen == list(range(1, 25)), seen


async def test_slow_client_is_disconnected_and_slows_nobody(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_send_queue_size=64, gateway_send_timeout_seconds=30) as srv:
        async with (
            gateway_client(srv.url, ALICE_TOKEN) as fast,
            gateway_client(srv.url, ALICE_TOKEN, max_queue=1) as slow,
        ):
            await fast.attach("web:alice")
            await slow.attach("web:alice")
            # The slow client stops reading while the session publishes a lot.
            blob = secrets.token_urlsafe(48_000)  # 64 kB that per-message deflate cannot shrink
            count = 200

            async def read_fast() -> list[int]:
                return [(await fast.expect("delta", timeout=10))["i"] for _ in range(count)]

            fast_reader = asyncio.create_task(read_fast())
            for i in range(count):
                event = {"type": "delta", "session_key": "web:alice", "i": i, "text": blob}
                await srv.runtime.bus.publish("web:alice", event)
                await asyncio.sleep(0.01)  # a fast stream, not one blocking burst
            # The fast client gets everything, in order.
            assert await fast_reader == list(range(count))
            # The session goes on for everyone else.
            await fast.send({"type": "send", "text": "still there?", "client_message_id": "f1"})
            answer = await fast.messages_until_answer()
            assert answer[-1]["content"] == "You said: still there?"
            # The slow one was cut off with "too slow" (it reads what was in flight, then the close).
            assert await slow.closed_with(timeout=15) == 4008
            assert slow.ws.close_reason is not None and slow.ws.close_reason.startswith("too slow")
        try:
            await slow.ws.send("{}")
        except ConnectionClosed:
            pass


async def test_switching_keys_and_resuming_too_far_back(gateway_serve: GatewayServe) -> None:
    async with gateway_serve(gateway_resume_limit=3, gateway_history_limit=2) as srv:
        async with (
            gateway_client(srv.url, ALICE_TOKEN) as talker,
            gateway_client(srv.url, ALICE_TOKEN) as tab,
        ):
            await talker.attach("web:alice:work")
            await tab.attach("web:alice:work")
            await talker.send({"type": "send", "text": "one", "client_message_id": "1"})
            first = await tab.messages_until_answer()
            await talker.messages_until_answer()
            # The tab switches to another key: it no longer gets the first key's messages.
            ready = await tab.attach("web:alice:home")
            assert ready["session_key"] == "web:alice:home" and ready["messages"] == []
            await talker.send({"type": "send", "text": "two", "client_message_id": "2"})
            await talker.messages_until_answer()
            await talker.send({"type": "send", "text": "three", "client_message_id": "3"})
            await talker.messages_until_answer()
            await tab.send({"type": "ping"})
            await tab.expect("pong")
            assert not [f for f in tab.frames if f["type"] == "message" and f["content"] in ("two", "three")]
            # Back on the first key with its old position: 4 messages were missed, more than
            # the resume limit, so the tab gets recent history marked as not continuous.
            ready = await tab.attach("web:alice:work", session_id=first[-1]["session_id"], last_seq=2)
            assert ready["truncated"] is True
            assert [m["seq"] for m in ready["messages"]] == [5, 6] and ready["last_seq"] == 6
