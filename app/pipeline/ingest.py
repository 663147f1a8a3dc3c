"""Ingest: the first step of an event's way, after a channel verified and parsed it.

admit (who may talk and how much: `app.access`; overrides only where allowed) → store (the
inbox commit: durable, deduplicated) → hand the stored events to the scheduler → return
what the store said, which the channel answers the platform with. A refused event is not
stored; the gate may have answered its sender (a pairing code, a quota notice).

Once the store was asked, the rest runs even if the caller goes away (a platform that
hung up): an event that was stored is always handed on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from app import tracing
from app.access import AccessGate, Verdict
from app.channel import AcceptResult, ChannelSettings
from app.db.outage import shielded
from app.events import InboundEvent
from app.pipeline.scheduler import Scheduler
from app.pipeline.storage.port import PipelineStore
from app.pipeline.waiters import Waiters

Counted = Callable[[str, str], None]
"""Called with a channel name and what happened to one of its events (`accepted`,
`deduplicated`, `skipped`): the metrics."""


StoredAs = Callable[[str, str], Awaitable[tuple[str, str] | None]]
"""(channel, platform id) → the (event id, session key) it was stored under, if it was."""


class Ingest:
    def __init__(
        self,
        store: PipelineStore,
        scheduler: Scheduler,
        waiters: Waiters,
        channel_settings: Mapping[str, ChannelSettings],
        *,
        gate: AccessGate,
        counted: Counted | None = None,
        assign: Callable[[InboundEvent], Awaitable[InboundEvent]] | None = None,
        on_stored: Callable[[Sequence[InboundEvent]], Awaitable[None]] | None = None,
        stored_as: StoredAs | None = None,
    ) -> None:
        self.stored_as = stored_as
        self.assign = assign  # puts the serving agent on an event (app.agents)
        self.on_stored = on_stored  # told the newly stored events (app.agents.senders)
        self.store = store
        self.gate = gate
        self.scheduler = scheduler
        self.waiters = waiters
        self.channel_settings = channel_settings
        self.counted = counted or (lambda channel, outcome: None)

    async def accept(self, channel: str, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        """A channel's events: admitted by its policy, then stored and handed on.

        Shielded as a whole: a caller that goes away mid-way (a platform hanging up) does not
        stop an accept that began — its events are stored and answered, and a pairing code
        or a lease taken on the way is never left half done."""
        return await shielded(self._traced_accept(channel, events))

    async def _traced_accept(self, channel: str, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        with tracing.ingest(channel, len(events), replica=self.scheduler.owner):
            return await self._accept(channel, events)

    async def _accept(self, channel: str, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        settings = self.channel_settings[channel]
        admitted: list[InboundEvent] = []
        results: list[AcceptResult | None] = []
        for event in events:
            if event.channel != channel:
                raise ValueError(f"channel {channel!r} produced an event for {event.channel!r}")
            if event.session_key_override and not settings.allow_session_override:
                event = event.model_copy(update={"session_key_override": None})
            event, refused = await self._admit(settings, event)
            if isinstance(refused, AcceptResult):  # a redelivery: answered as it was the first time
                self.counted(channel, "deduplicated")
                results.append(refused)
                continue
            if refused is not None:
                self.counted(channel, "skipped")
                results.append(
                    AcceptResult(
                        event_id=event.event_id,
                        session_key=event.session_key,
                        skipped=True,
                        reason=refused.reason,
                        notice=refused.notice,
                    )
                )
                continue
            admitted.append(event)
            results.append(None)
        stored = iter(await self._submit(admitted) if admitted else [])
        out: list[AcceptResult] = []
        for result in results:
            if result is None:
                result = next(stored)
                self.counted(channel, "deduplicated" if result.duplicate else "accepted")
            out.append(result)
        return out

    async def _admit(
        self, settings: ChannelSettings, event: InboundEvent
    ) -> tuple[InboundEvent, Verdict | AcceptResult | None]:
        """Who may talk, then the serving agent, then the quotas (which may be the agent's).

        An event stored before (a platform's retry) is a duplicate before any quota: it
        neither counts against one nor is refused by one (the sender might then send it
        again, and it would run twice)."""
        refused = await self.gate.check_access(settings, event)
        if refused is not None:
            return event, refused
        # Only for a quota: otherwise the store finds the redelivery itself, as it stores it.
        if (
            event.external_id is not None
            and self.stored_as is not None
            and self.gate.may_limit(settings, event.channel)
        ):
            seen = await self.stored_as(event.channel, event.external_id)
            if seen is not None:
                return event, AcceptResult(event_id=seen[0], session_key=seen[1], duplicate=True)
        if self.assign is not None:
            event = await self.assign(event)
        return event, await self.gate.check_quota(settings, event)

    async def submit(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        """Store events the gateway itself made (no channel policy) and hand them on
        (shielded like `accept`)."""
        return await shielded(self._assign_and_store(events))

    async def _assign_and_store(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        if self.assign is not None:
            events = [await self.assign(e) for e in events]
        return await self._submit(events)

    async def _submit(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        # The callers shield this: a cancelled caller must not leave a stored event, or a
        # lease taken with it, without a worker.
        return await self._store(events)

    async def _store(self, events: Sequence[InboundEvent]) -> list[AcceptResult]:
        owner = self.scheduler.offer(events[0].session_key) if len(events) == 1 else None
        try:
            with tracing.inbox_commit([e.event_id for e in events]):  # the rows store its context
                accepted = await self.store.accept(events, claim_for=owner)
        except BaseException:
            if owner is not None:
                self.scheduler.withdraw(events[0].session_key)
            raise
        for result in accepted.results:
            if not result.duplicate:
                self.waiters.accepted(result.event_id)
        self.scheduler.accepted(accepted.results, accepted.claim)
        if owner is not None:
            # A redelivery is answered under its original's key, which may not be the key
            # the slot was offered for (an agent or a handoff chosen since): give it back.
            self.scheduler.withdraw(events[0].session_key)
        if self.on_stored is not None:
            await self.on_stored(
                [e for e, r in zip(events, accepted.results, strict=True) if not r.duplicate]
            )
        return accepted.results
