"""Run slots: a bound on concurrent runs, which a worker can hand on with a lease.

Like a semaphore, slots go to keys in the order they asked. A worker whose turn's end
gives its key's lease up can also hand its slot straight to the longest waiting key,
together with that key's lease when the same statement took it (`Slot`, used as the
turn's `HandOn`): the key then starts without a statement of its own to take its lease.
Under load, when keys queue for slots, that is most of the leases taken.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict

from app.pipeline.storage.port import Claim


class RunSlots:
    """`size` slots; `take` waits for one."""

    def __init__(self, size: int) -> None:
        self._free = size
        self._waiting: OrderedDict[str, asyncio.Future[Claim | None]] = OrderedDict()
        self._picked: dict[str, asyncio.Future[Claim | None]] = {}

    def try_take(self, key: str) -> Slot | None:
        """A free slot now, if there is one and nobody waits for one."""
        if self._free > 0 and not self._waiting:
            self._free -= 1
            return Slot(self, key)
        return None

    async def take(self, key: str) -> Slot:
        """Wait for a slot for `key` (one waiter per key), maybe handed on with a claim."""
        slot = self.try_take(key)
        if slot is not None:
            return slot
        waiter: asyncio.Future[Claim | None] = asyncio.get_running_loop().create_future()
        self._waiting[key] = waiter
        try:
            claim = await waiter
        except asyncio.CancelledError:
            if self._waiting.get(key) is waiter:
                del self._waiting[key]
            elif waiter.done() and not waiter.cancelled():
                self._release()  # given a slot as it was cancelled: the next waiter's
            raise
        return Slot(self, key, claim)

    def _release(self) -> None:
        """Give a slot back: to the longest waiting key, or free."""
        while self._waiting:
            _, waiter = self._waiting.popitem(last=False)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    def _pick(self) -> str | None:
        if not self._waiting:
            return None
        key, waiter = self._waiting.popitem(last=False)
        self._picked[key] = waiter
        return key

    def _hand(self, key: str, claim: Claim | None) -> bool:
        waiter = self._picked.pop(key)
        if waiter.done():  # its worker is gone (the scheduler stops): the next one's
            self._release()
            return False
        waiter.set_result(claim)
        return True

    def _put_back(self, key: str) -> None:
        waiter = self._picked.pop(key)
        if not waiter.done():
            self._waiting[key] = waiter
            self._waiting.move_to_end(key, last=False)


class Slot:
    """One key's run slot (see the module); `release` when the key's work is done."""

    def __init__(self, slots: RunSlots, key: str, claim: Claim | None = None) -> None:
        self._slots = slots
        self.key = key
        self.claim = claim  # the key's lease, when the slot was handed on with it
        self._gone = False

    def pick(self) -> str | None:
        """The key waiting longest, out of line until `hand` or `put_back` (None: nobody)."""
        return None if self._gone else self._slots._pick()

    def hand(self, picked: str, claim: Claim | None) -> None:
        """This slot goes to `picked`, with its lease if it was taken (`claim`)."""
        self._gone = True
        self._slots._hand(picked, claim)

    def put_back(self, picked: str) -> None:
        self._slots._put_back(picked)

    def release(self) -> None:
        """The slot's key is done with it (nothing happens if it was handed on)."""
        if not self._gone:
            self._gone = True
            self._slots._release()
