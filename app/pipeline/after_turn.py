"""Work after a turn, still under the key's lease (memory consolidation)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog

from app.errors import LeaseLost
from app.sessions.hooks import AfterTurn
from app.sessions.lease import SessionLease
from app.sessions.store import SessionState

log = structlog.get_logger(__name__)


class AfterTurnHooks:
    def __init__(self, hooks: Sequence[AfterTurn]) -> None:
        self.hooks = list(hooks)

    def due(self, session: SessionState) -> bool:
        """Whether some hook may have work (under the lease) for `session`.

        A hook says so with a `due(session)` method; one without it always may.
        """
        for hook in self.hooks:
            due: Callable[[SessionState], bool] | None = getattr(hook, "due", None)
            if due is None or due(session):
                return True
        return False

    async def run(self, lease: SessionLease, session: SessionState) -> None:
        for hook in self.hooks:
            try:
                await hook(lease, session)
            except LeaseLost:
                raise
            except Exception:
                log.exception("after_turn_failed", hook=getattr(hook, "__name__", repr(hook)))
