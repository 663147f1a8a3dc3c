"""What the storage port's command, steer and outbox operations take and give (`port`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState


@dataclass(frozen=True)
class Answer:
    """What answers a command (or a paused turn), written in the commit of its operation:
    its inbox rows done (linked to the run `link` if given) and its outbox rows. A reply row
    whose `session_id` is None gets the session the operation wrote, if it wrote one."""

    row_ids: Sequence[int]
    replies: Sequence[Mapping[str, Any]] = ()
    link: int | None = None


@dataclass(frozen=True)
class OpenSession:
    """The key's open session as a command sees it (`open_session`)."""

    session: SessionState
    title: str | None
    pending_approvals: int
    metadata: dict[str, Any]  # as stored (a tool, load_skill, may have written it during a turn)


@dataclass(frozen=True)
class PausedRun:
    """A run of the key's open session that waits for an approval (`paused_run`)."""

    session: SessionState
    run_id: int
    details: Mapping[str, Any]


@dataclass(frozen=True)
class Injected:
    """Steered rows that joined a running turn (`inject`)."""

    row_ids: list[int]  # the rows counted (a row canceled meanwhile is not)
    added: list[ChatMessage]  # the user messages appended (a retry's may be stored already)
    seqs: list[int]


@dataclass(frozen=True)
class ApprovalRequest:
    """A pending approval a pausing run stores (`pause_for_approval`)."""

    session_id: int
    run_id: int
    call_id: str
    name: str
    arguments: Mapping[str, Any]
    requested_at: datetime
    expires_at: datetime


@dataclass(frozen=True)
class OutboxClaim:
    """What the sender claims: the due rows of its channels, each the oldest of its key."""

    channels: tuple[str, ...]
    now: datetime
    until: datetime  # the claim's deadline: after it the row is claimable again
    limit: int
    # Who claims: a row this owner claimed before is claimable by it again at once (a
    # claim whose commit reached the database but whose answer was lost).
    owner: str


# A metadata change: new values merged into the stored metadata, or a function of it.
MetadataChange = Mapping[str, Any] | Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class PaceBucket:
    """One token bucket of outbound pacing: its name and the seconds between two sends.
    `exclusive`: one final answer in flight at a time (a chat, a group), so a platform's
    `retry_after` is known before the next send to it leaves, on any replica."""

    name: str
    interval: float
    exclusive: bool = False


@dataclass(frozen=True)
class PaceTake:
    """A send asking its buckets for a slot (`PipelineStore.take_pace`).

    `now` is unix seconds. A final answer takes the first slot every bucket allows if it
    comes within `within` seconds; else it takes nothing and is told when to come back
    (previews yield to it until then). A preview takes a slot only when every bucket is
    free now, has been idle for a whole interval and no final answer waits for it.

    A granted final answer holds its exclusive buckets until it is answered
    (`PipelineStore.release_pace`), for at most `hold` seconds (a sender that died
    mid-send does not hold them longer); while held, another final answer is told `busy`.
    """

    buckets: tuple[PaceBucket, ...]
    now: float
    within: float
    preview: bool = False
    hold: float = 0.0


@dataclass(frozen=True)
class PaceGrant:
    """`granted`: the send may go at `at` (unix seconds); else the earliest it could.
    `held_until`: the hold a granted send releases when answered (0: none); `busy`: not
    granted because another send to the chat is in flight (ask again at `at`)."""

    granted: bool
    at: float
    held_until: float = 0.0
    busy: bool = False
