"""What a turn is made of while it runs, and what it hands its key's worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from app.agent.trust import Trust
from app.events import InboundEvent
from app.memory.store import Memory
from app.pipeline.run_trace import RunRow
from app.pipeline.storage.port import Claim, InboxRow
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState


@dataclass(frozen=True)
class WindowLimits:
    max_messages: int | None
    max_tokens: int | None


class HandOn(Protocol):
    """The worker's run slot, which a turn's end that gives the lease up may hand to the
    key waiting longest, with that key's lease (`app.pipeline.slots.Slot`)."""

    def pick(self) -> str | None:
        """The key waiting longest for a slot, out of line (None: nobody waits)."""
        ...

    def hand(self, picked: str, claim: Claim | None) -> None:
        """Give the slot to `picked` (with its lease when the end took it)."""

    def put_back(self, picked: str) -> None:
        """`picked` gets no slot now: first in line again."""


@dataclass(frozen=True)
class Handled:
    """What a turn leaves its key's worker.

    `upcoming`: the key's next rows as the turn's end read them (None: not read).
    `released`: the turn's end gave the lease up, the key having nothing left to do.
    """

    upcoming: list[InboxRow] | None = None
    released: bool = False


@dataclass
class TurnState:
    """The mutable state of one turn: which inbox rows it answers, where the reply goes."""

    lease: SessionLease
    session: SessionState
    rows: list[InboxRow]
    run_id: int
    origin: InboundEvent  # whose request the run serves (tool context, policy)
    reply_to: InboundEvent  # the event the final answer replies to
    run_row: RunRow | None  # None: read it when saving
    # A run resumed by /approve already has replies (the question): its new inbox rows are
    # not linked by run id, so waiting clients get only the replies to their own event.
    link_rows: bool = True
    # The session's newest messages after `last_consolidated` as stored, oldest first, when
    # the start read them; kept up to date with what the turn appends (nobody else appends
    # under its lease), so the window needs no read. None: read it.
    stored: list[ChatMessage] | None = None
    recalled: list[Memory] | None = None
    # The key's rows but the turn's own, as the latest append read them; None: read them.
    pending: list[InboxRow] | None = None
    watched: bool = True  # whether another replica may watch the key (else no NOTIFY)
    hand_on: HandOn | None = None  # a fresh turn's end may give the lease up (and hand on)
    upcoming: list[InboxRow] | None = None
    released: bool = False
    model: str | None = None  # the model the run asks (its context limit applies)
    # Whom the run serves and what it has read (`app.agent.trust`); set by the turn's start.
    trust: Trust = field(default_factory=Trust)

    @property
    def handled_ids(self) -> set[int]:
        return {r.id for r in self.rows}
