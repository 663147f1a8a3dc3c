"""The inbox poller takes other replicas' keys only as far as it has free run slots."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import func, select

from app.agent.provider import ProviderReply, ToolSpec
from app.db.models import inbox, outbox
from app.events import InboundEvent
from app.migrate import upgrade
from app.runtime import Runtime
from app.sessions.messages import ChatMessage
from tests.conftest import make_settings, webhook_settings
from tests.support.timing import eventually


@dataclass
class GatedProvider:
    """Answers `echo <text>` once `gate` is open; records which texts it was asked."""

    gate: asyncio.Event
    name: str = "gated"
    asked: list[str] = field(default_factory=list)

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        text = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        self.asked.append(text)
        await self.gate.wait()
        return ProviderReply(content=f"echo {text}")

    async def aclose(self) -> None:
        return None


async def _asked(model: GatedProvider, count: int) -> bool:
    return len(model.asked) == count


async def _idle(*replicas: Runtime) -> bool:
    return not any(r.scheduler.busy_keys for r in replicas)


def _replica(db_url: str, provider: GatedProvider, poll: float) -> Runtime:
    settings = make_settings(db_url, auto_migrate=False, max_concurrent_runs=1, inbox_poll_seconds=poll)
    return Runtime(settings, channel_settings={"webhook": webhook_settings()}, provider=provider)


async def test_a_busy_replica_takes_one_waiting_key_at_a_time_and_nothing_is_lost(db_url: str) -> None:
    await upgrade(db_url)
    gate = asyncio.Event()
    a_model, b_model = GatedProvider(gate), GatedProvider(gate)
    # A polls rarely (it would rightly take B's own key in the moment before B leases it);
    # B's poller is the one under test.
    async with _replica(db_url, a_model, poll=30) as a:
        # Each replica's only run slot is taken by a run of its own that waits for the gate
        # (B starts once A's run holds its key: B's poller would rightly take a key that is
        # waiting for nobody).
        await a.ingest.submit([InboundEvent.from_text("webhook", "a", "u", "a's own")])
        await eventually(lambda: _asked(a_model, 1))
        async with _replica(db_url, b_model, poll=0.05) as b:
            await b.ingest.submit([InboundEvent.from_text("webhook", "b", "u", "b's own")])
            await eventually(lambda: _asked(b_model, 1))
            await _queue_at_a_and_release(a, b, gate)
        async with a.engine.connect() as conn:
            statuses = (
                await conn.execute(select(inbox.c.status, func.count()).group_by(inbox.c.status))
            ).all()
            replies = (await conn.execute(select(func.count()).select_from(outbox))).scalar_one()
    assert statuses == [("done", 6)] and replies == 6
    assert sorted(a_model.asked + b_model.asked) == sorted(
        ["a's own", "b's own", *(f"queued {i}" for i in range(4))]
    )


async def _queue_at_a_and_release(a: Runtime, b: Runtime, gate: asyncio.Event) -> None:
    # Four more keys queue at replica A, waiting for its slot (no lease held).
    for i in range(4):
        await a.ingest.submit([InboundEvent.from_text("webhook", f"q{i}", "u", f"queued {i}")])
    await asyncio.sleep(0.6)  # about a dozen of B's polls
    assert set(b.scheduler.busy_keys) == {"webhook:b", "webhook:q0"}  # the longest waiting
    assert set(a.scheduler.busy_keys) == {"webhook:a", *(f"webhook:q{i}" for i in range(4))}
    gate.set()
    await eventually(lambda: _idle(a, b))
