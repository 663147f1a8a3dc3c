"""The in-memory session cache: bounded, LRU, never evicts a session mid-run."""

from __future__ import annotations

from app.sessions.cache import SessionCache


def test_lru_eviction_skips_pinned_entries() -> None:
    cache: SessionCache[str] = SessionCache(capacity=2)
    cache.put("a", "A", fence=1)
    cache.pin("a")  # "a" is mid-run
    cache.put("b", "B", fence=1)
    cache.put("c", "C", fence=1)  # over capacity: evict the least recent unpinned → "b"
    assert "a" in cache and "b" not in cache and "c" in cache
    cache.put("d", "D", fence=1)
    assert "a" in cache and "c" not in cache and "d" in cache
    assert cache.get("a", fence=1) == "A"  # reading makes "a" the most recent
    cache.unpin("a")
    cache.put("e", "E", fence=1)
    assert "d" not in cache and "a" in cache and len(cache) == 2
    cache.put("f", "F", fence=1)
    assert "a" not in cache


def test_all_pinned_may_exceed_capacity_until_unpinned() -> None:
    cache: SessionCache[int] = SessionCache(capacity=1)
    for i, key in enumerate("xyz"):
        cache.pin(key)
        cache.put(key, i, fence=1)
    assert len(cache) == 3
    assert [cache.get(k, fence=1) for k in "xyz"] == [0, 1, 2]
    for key in "xyz":
        cache.unpin(key)
    assert len(cache) == 1


def test_entries_are_only_valid_under_the_fence_they_were_read_with() -> None:
    cache: SessionCache[str] = SessionCache(capacity=4)
    cache.put("k", "state", fence=5)
    assert cache.get("k", fence=5) == "state"
    assert cache.get("k", fence=6) is None  # the lease was released in between
    cache.invalidate("k")
    assert cache.get("k", fence=5) is None


def test_eviction_passes_pinned_entries_at_the_old_end() -> None:
    """Pinned entries in front of the unpinned ones do not stop the eviction."""
    cache: SessionCache[int] = SessionCache(capacity=2)
    for key in ("p1", "p2"):
        cache.pin(key)
        cache.put(key, 0, fence=1)
    for i in range(5):
        cache.put(f"u{i}", i, fence=1)
    assert {k for k in ("p1", "p2", "u0", "u1", "u2", "u3", "u4") if k in cache} == {"p1", "p2", "u4"}
    cache.unpin("p1")
    cache.unpin("p2")
    assert len(cache) == 2 and "u4" in cache
