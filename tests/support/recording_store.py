"""A recording wrapper of the storage port: which operations ran, by name, in order.

`Runtime(settings, wrap_store=recording)` puts it around the store the assembly chose;
tests then assert on `store.ran` (`"close_session"`, `"claim_outbox"` …) instead of
matching the SQL text a store happens to send.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast

from app.pipeline.storage.port import PipelineStore
from app.sessions.store import SessionStore


class RecordingStore:
    """Runs every operation of `inner`, noting its name first."""

    def __init__(self, inner: PipelineStore) -> None:
        self.inner = inner
        self.ran: list[str] = []

    @property
    def sessions(self) -> SessionStore:
        return self.inner.sessions

    def __getattr__(self, name: str) -> Any:
        found = getattr(self.inner, name)
        if not inspect.iscoroutinefunction(found):
            return found

        async def recorded(*args: Any, **kwargs: Any) -> Any:
            self.ran.append(name)
            return await found(*args, **kwargs)

        return recorded

    def clear(self) -> None:
        self.ran.clear()


def recording() -> tuple[Callable[[PipelineStore], PipelineStore], Callable[[], RecordingStore]]:
    """A `wrap_store` for the runtime, and what reads back the wrapper it made."""
    made: list[RecordingStore] = []

    def wrap(store: PipelineStore) -> PipelineStore:
        made.append(RecordingStore(store))
        return cast(PipelineStore, made[-1])

    return wrap, lambda: made[-1]
