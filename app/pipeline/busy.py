"""Busy policies: what happens to messages that arrive while a session's turn is running.

One object per policy, chosen per channel when the runtime is built (`BusyPolicies`):

- `queue` (default): each message is a turn of its own, in arrival order;
- `collect`: the messages that queued up are merged into one turn, after a short debounce;
- `steer`: messages that arrive during a run are injected at its next tool boundary.

Nothing is ever dropped or overwritten; commands are never merged or injected (they are
handled on their own).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

from app.events import BusyPolicy as PolicyName
from app.pipeline.storage.port import InboxRow

ReadRows = Callable[[int], Awaitable[list[InboxRow]]]
"""Reads the key's next unfinished rows, at most that many."""

IsCommand = Callable[[InboxRow], bool]


class BusyPolicy(Protocol):
    name: PolicyName

    async def batch(self, rows: Sequence[InboxRow], read: ReadRows, is_command: IsCommand) -> list[InboxRow]:
        """The rows of the key's next turn, from its next `rows` (or read anew)."""
        ...

    def injected(self, pending: Sequence[InboxRow], channel: str, is_command: IsCommand) -> list[InboxRow]:
        """Of the rows that arrived during a run of `channel`, those to add to it at a tool boundary."""
        ...


class Queue:
    name = PolicyName.QUEUE

    async def batch(self, rows: Sequence[InboxRow], read: ReadRows, is_command: IsCommand) -> list[InboxRow]:
        return list(rows[:1])

    def injected(self, pending: Sequence[InboxRow], channel: str, is_command: IsCommand) -> list[InboxRow]:
        return []


class Collect:
    """Merge what queued up, after waiting `debounce` seconds for the rest of a burst."""

    name = PolicyName.COLLECT
    limit = 100  # rows merged into one turn at most

    def __init__(self, debounce: float) -> None:
        self.debounce = debounce

    async def batch(self, rows: Sequence[InboxRow], read: ReadRows, is_command: IsCommand) -> list[InboxRow]:
        if not rows or is_command(rows[0]):
            return list(rows[:1])
        await asyncio.sleep(self.debounce)
        rows = await read(self.limit)
        if not rows:
            return []
        # Never merge across channels (a reply goes back to one place), and never merge a
        # command (/stop, /approve …) into a message turn.
        first = rows[0].channel
        merged = list(itertools.takewhile(lambda r: r.channel == first and not is_command(r), rows))
        return merged or rows[:1]

    def injected(self, pending: Sequence[InboxRow], channel: str, is_command: IsCommand) -> list[InboxRow]:
        return []


class Steer:
    """Each message is a turn of its own, but messages arriving during a run join it."""

    name = PolicyName.STEER

    def __init__(self, max_attempts: int) -> None:
        self.max_attempts = max_attempts

    async def batch(self, rows: Sequence[InboxRow], read: ReadRows, is_command: IsCommand) -> list[InboxRow]:
        return list(rows[:1])

    def injected(self, pending: Sequence[InboxRow], channel: str, is_command: IsCommand) -> list[InboxRow]:
        steer: list[InboxRow] = []
        for row in pending:  # only the oldest run of plain messages: order is kept
            if row.channel != channel or is_command(row) or row.attempts >= self.max_attempts:
                break
            steer.append(row)
        return steer


class BusyPolicies:
    """The policy of each channel, built once (`queue` for channels without one)."""

    def __init__(
        self, names: Mapping[str, PolicyName], *, collect_debounce: float, max_attempts: int
    ) -> None:
        built: dict[PolicyName, BusyPolicy] = {
            PolicyName.QUEUE: Queue(),
            PolicyName.COLLECT: Collect(collect_debounce),
            PolicyName.STEER: Steer(max_attempts),
        }
        self._default = built[PolicyName.QUEUE]
        self._by_channel = {channel: built[name] for channel, name in names.items()}

    def of(self, channel: str) -> BusyPolicy:
        return self._by_channel.get(channel, self._default)
