"""A bounded LRU of in-memory session state that never evicts a session mid-run.

Entries remember the lease fence they were read under and are only reused under that
same fence, i.e. while this worker keeps holding the key: once the lease was released,
anyone (another replica, an admin action) may have changed the session, so the next
holder reads it again. A pinned entry (its key is being worked on) is never evicted.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V")


@dataclass
class _Entry(Generic[V]):
    value: V | None
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

    def get(self, key: str, *, fence: int) -> V | None:
        """The cached value if it was stored under this very lease fence."""
        entry = self._entries.get(key)
        if entry is None or entry.value is None or entry.fence != fence:
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

    def invalidate(self, key: str) -> None:
        """Forget the value (the session changed) but keep a pin if there is one."""
        entry = self._entries.get(key)
        if entry is not None:
            entry.value = None

    def invalidate_where(self, predicate: Callable[[V], bool]) -> None:
        for entry in self._entries.values():
            if entry.value is not None and predicate(entry.value):
                entry.value = None

    def pin(self, key: str) -> None:
        """Mark a key as mid-run: its entry stays until `unpin`."""
        entry = self._entries.setdefault(key, _Entry(None, -1))
        entry.pins += 1

    def unpin(self, key: str) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.pins > 0:
            entry.pins -= 1
        self._evict()

    def pinned(self, key: str) -> bool:
        entry = self._entries.get(key)
        return entry is not None and entry.pins > 0

    def _evict(self, protect: str | None = None) -> None:
        """Drop the least recently used unpinned entries down to the capacity.

        Walks from the oldest end only as far as it must (not a copy of every key: that made
        each put O(capacity) once the cache was full). A pinned entry met on the way is in
        use, so it moves to the recent end; none is looked at twice.
        """
        entries = self._entries
        kept = 0  # entries moved to the end: once all are, none can go
        while len(entries) > self.capacity and kept < len(entries):
            key, entry = next(iter(entries.items()))
            if entry.pins or key == protect:
                entries.move_to_end(key)
                kept += 1
            else:
                del entries[key]
