"""What may run after a turn, still under the key's lease (e.g. memory consolidation)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from app.sessions.lease import SessionLease
from app.sessions.store import SessionState

AfterTurn = Callable[[SessionLease, SessionState], Awaitable[None]]
"""Runs after a turn finished, still under the key's lease (the pipeline's `AfterTurnHooks`)."""
