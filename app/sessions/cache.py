"""A bounded LRU of in-memory session state that never evicts a session mid-run.

Entries remember the lease fence they were read under. A worker that takes a key's
lease with fence `f` may only reuse an entry stored under `f - 1` by this same process:
any other fence means someone else held the key in between and the entry is stale.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    value: V
    fence: int
    pins: int = 0


class SessionCache(Generic[V]):
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._entries: OrderedDict[str, _Entry[V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str, *, fence: int | None = None) -> V | None:
        """The cached value; with `fence`, only if it is still valid under that lease."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if fence is not None and entry.fence not in (fence, fence - 1):
            self._entries.pop(key)
            return None
        self._entries.move_to_end(key)
        return entry.value

    def put(self, key: str, value: V, *, fence: int) -> None:
        """Store `key`'s state; the entry just stored is never the one evicted."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.value, entry.fence = value, fence
            self._entries.move_to_end(key)
        else:
            self._entries[key] = _Entry(value, fence)
        self._evict(protect=key)

    def pin(self, key: str) -> None:
        """Mark a key as mid-run: it stays cached until `unpin`."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.pins += 1

    def unpin(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1
        self._evict()

    def discard(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.pins == 0:
            del self._entries[key]

    def _evict(self, protect: str | None = None) -> None:
        if len(self._entries) <= self.capacity:
            return
        for key in list(self._entries):
            if len(self._entries) <= self.capacity:
                break
            if self._entries[key].pins == 0 and key != protect:
                del self._entries[key]
