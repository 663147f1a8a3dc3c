"""Waiting for an event's replies (`?wait=true`, the CLI) when this process handled it.

The turn that answered hands its result to the waiter, which then does not read the
database; the result is the same as the read's. Other replies (commands, another
replica's work) are still read.
"""

from __future__ import annotations

from typing import Any

from app.events import InboundEvent
from tests.conftest import ServeApp
from tests.support.pipeline import wait_elsewhere
from tests.support.recording_store import RecordingStore, recording


class _WaiterReads:
    """Counts the waiter's reads of an event's status and replies (`replies_if_done`)."""

    def __init__(self, store: RecordingStore) -> None:
        self.store = store
        self.start = 0

    @property
    def count(self) -> int:
        return self.store.ran[self.start :].count("replies_if_done")

    def __enter__(self) -> _WaiterReads:
        self.start = len(self.store.ran)
        return self

    def __exit__(self, *_exc: object) -> None:
        pass


def _comparable(result: Any) -> list[tuple[str, str, list[dict[str, Any]]]]:
    return [(r.message_id, r.text, r.parts) for r in result.replies]


async def test_a_turn_hands_its_answer_to_the_waiter_without_a_read(serve: ServeApp) -> None:
    wrap, recorded = recording()
    async with serve(wrap_store=wrap) as srv:
        runtime = srv.runtime
        for text in ("hello", "what time is it?"):  # a plain turn and one with a tool call
            [accepted] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c1", "u1", text)])
            with _WaiterReads(recorded()) as reads:
                # A long poll: the waiter's periodic look (for other replicas' work) stays out.
                handed = await runtime.waiters.wait_for_replies(accepted.event_id, 10, poll=10)
            assert reads.count == 0
            assert handed.done and len(handed.replies) == 1 and handed.replies[0].text
            # As committed with the answer: a webhook without a callback URL sends nothing.
            assert handed.replies[0].status == "sent"
            read = await wait_elsewhere(srv.runtime.engine, accepted.event_id, 10)
            assert read.done and _comparable(read) == _comparable(handed)
            assert [r.status for r in read.replies] == ["sent"]


async def test_command_replies_and_late_waiters_still_read(serve: ServeApp) -> None:
    wrap, recorded = recording()
    async with serve(wrap_store=wrap) as srv:
        runtime = srv.runtime
        [hello] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c1", "u1", "hello")])
        answered = await runtime.waiters.wait_for_replies(hello.event_id, 10)
        [command] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c1", "u1", "/new")])
        with _WaiterReads(recorded()) as reads:
            new = await runtime.waiters.wait_for_replies(command.event_id, 10)
            again = await runtime.waiters.wait_for_replies(hello.event_id, 10)  # long handled
        assert reads.count >= 2
        assert new.done and [r.text for r in new.replies] and new.replies[0].text != answered.replies[0].text
        assert again.done and _comparable(again) == _comparable(answered)
