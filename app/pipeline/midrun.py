"""Input that arrives while a turn runs: a `/stop`, and messages the `steer` policy injects.

A running turn looks for them at each tool boundary (`at_boundary`) and, while the model
or a tool is working, waits for a `/stop` (`wait_stop`). Events accepted in this process
wake it at once (`input_arrived`); those accepted by other replicas are found by polling
the key's rows every `stop_poll` seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from app.agent.loop import StopRequest
from app.db.outage import shielded
from app.pipeline.busy import BusyPolicies
from app.pipeline.commands import CommandRegistry
from app.pipeline.storage.port import InboxRow, PipelineStore

# How many of the key's rows a running turn looks at.
PENDING_LIMIT = 50


@dataclass(frozen=True)
class AtBoundary:
    """What a tool boundary found: a stop, or rows to add to the run (either may be empty)."""

    stop: StopRequest | None = None
    inject: Sequence[InboxRow] = ()


class MidRun:
    def __init__(
        self, store: PipelineStore, commands: CommandRegistry, policies: BusyPolicies, *, stop_poll: float
    ) -> None:
        self.store = store
        self.commands = commands
        self.policies = policies
        self.stop_poll = stop_poll
        self._signals: dict[str, asyncio.Event] = {}

    def input_arrived(self, key: str) -> None:
        """An event for `key` was accepted in this process while its worker is busy."""
        signal = self._signals.get(key)
        if signal is not None:
            signal.set()

    @contextmanager
    def running(self, key: str) -> Iterator[None]:
        """While a turn of `key` runs, input for it wakes it."""
        self._signals.setdefault(key, asyncio.Event())
        try:
            yield
        finally:
            self._signals.pop(key, None)

    async def pending(self, key: str, handled: set[int]) -> list[InboxRow]:
        return [r for r in await self.store.next_rows(key, PENDING_LIMIT) if r.id not in handled]

    def stop_in(self, rows: Sequence[InboxRow]) -> StopRequest | None:
        for row in rows:
            if self.commands.is_in_turn(row):
                return StopRequest(row_id=row.id, event_id=row.event_id, sender_id=row.event.sender_id)
        return None

    async def at_boundary(
        self, key: str, channel: str, handled: set[int], known: list[InboxRow] | None
    ) -> AtBoundary:
        """Between tool-call groups. `known`: the pending rows as the last append read them."""
        signal = self._signals.get(key)
        arrived = signal is not None and signal.is_set()
        if signal is not None:
            signal.clear()
        pending = known if known is not None and not arrived else await self.pending(key, handled)
        if not pending:
            return AtBoundary()
        stop = self.stop_in(pending)
        if stop is not None:
            return AtBoundary(stop=stop)
        return AtBoundary(
            inject=self.policies.of(channel).injected(pending, channel, self.commands.is_command)
        )

    async def wait_stop(self, key: str, handled: set[int]) -> StopRequest:
        """Completes when a `/stop` for the key is pending (woken locally, polled across replicas)."""
        signal = self._signals.setdefault(key, asyncio.Event())
        while True:
            # Not `asyncio.wait_for`: on Python 3.11 it can swallow the cancellation the
            # run loop sends when the model call finished at the moment the signal fired,
            # and this watcher would then never end.
            woken = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait({woken}, timeout=self.stop_poll)
            finally:
                woken.cancel()
            signal.clear()
            # The run loop cancels this watcher when the model answers, maybe mid-read:
            # shielded, the read finishes and returns its pooled connection regardless.
            stop = self.stop_in(await shielded(self.pending(key, handled)))
            if stop is not None:
                return stop
