"""Which port operation each command, the waiter and the sender use, by name (a recording
wrapper of the store, `tests.support.recording_store`): nothing above the port writes
through a connection of its own."""

from __future__ import annotations

from app.events import InboundEvent
from tests.conftest import ServeApp
from tests.support.recording_store import recording

# What the scheduler, the waiter and the sender run for any event: left out to see the
# command's own.
_WAY = {
    "accept",
    "take",
    "renew",
    "release",
    "next_rows",
    "count_attempt",
    "replies_if_done",
    "claimable_keys",
    "reclaim_expired",  # the scheduler frees expired leases of keys with work on every poll
    "claim_outbox",
}


async def test_each_command_writes_through_its_named_operation(serve: ServeApp) -> None:
    wrap, recorded = recording()
    async with serve(wrap_store=wrap) as srv:
        runtime = srv.runtime

        async def ask(text: str) -> list[str]:
            recorded().clear()
            [accepted] = await runtime.ingest.submit([InboundEvent.from_text("webhook", "c1", "u1", text)])
            result = await runtime.waiters.wait_for_replies(accepted.event_id, 20)
            assert result.done and result.replies
            return [name for name in recorded().ran if name not in _WAY]

        assert await ask("hello") == ["start", "finish"]
        assert await ask("/whoami") == ["answer"]
        assert await ask("/title Plans") == ["set_session_metadata"]
        assert await ask("/model") == ["open_session", "answer"]
        assert await ask("/stop") == ["paused_run", "answer"]
        assert await ask("/new") == ["close_session"]
        assert await ask("/sessions") == ["open_session", "generations", "answer"]


async def test_the_sender_claims_through_the_port(serve: ServeApp) -> None:
    wrap, recorded = recording()
    async with serve(wrap_store=wrap, outbox_poll_seconds=60) as srv:  # the test drives the sender
        recorded().clear()
        await srv.runtime.sender.deliver_due()
        # The scheduler polls meanwhile (its own operations of the way are left out).
        polled = _WAY - {"claim_outbox"}
        assert [name for name in recorded().ran if name not in polled] == ["claim_outbox"]
