"""Queries over the inbox that every store runs (built once: the values come as parameters)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import bindparam, func, literal, or_, select, union_all, update

from app.channel import Reply
from app.db.models import CANCELED, INBOX_UNFINISHED, inbox, one_of, outbox, session_keys
from app.events import PRIVATE_NOTICE_KEY

# What a turn needs to know of the rows after it: the next one, and whether one more waits.
UPCOMING_LIMIT = 2
# How many of the key's rows the boundary after a group's tool results looks at.
PENDING_LIMIT = 50

# What an `InboxRow` is made of.
ROW_COLUMNS = ("id", "event_id", "channel", "session_key", "attempts", "payload", "trace_context")


def unfinished_rows(key: Any = None) -> Any:
    """The `key` key's unfinished rows in inbox order (the order they are handled in).

    `key` is an expression, by default the bound parameter `k`.
    """
    return (
        select(*(inbox.c[name] for name in ROW_COLUMNS))
        .where(
            inbox.c.session_key == (bindparam("k") if key is None else key),
            one_of(inbox.c.status, INBOX_UNFINISHED),
        )
        .order_by(inbox.c.id)
    )


NEXT_ROWS = unfinished_rows().limit(bindparam("limit"))

# The other columns to set come with the parameters.
MARK = update(inbox).where(inbox.c.id.in_(bindparam("ids", expanding=True)))
COUNT_ATTEMPT = MARK.values(attempts=inbox.c.attempts + 1)
# A turn's rows counted before it runs: a row canceled since it was read is not. Under
# the lease only a cancel (A2A tasks/cancel) finishes a row meanwhile, so this is
# `status <> canceled`, not `status IN unfinished`: with that, PostgreSQL's generic plan
# walked the status index over every unfinished row instead of fetching the turn's rows
# by id (0.77 against 0.13 ms per turn with 1,000 sessions busy, bench_webhook_e2e).
NOT_CANCELED = inbox.c.status != CANCELED
COUNT_UNFINISHED = COUNT_ATTEMPT.where(NOT_CANCELED).returning(inbox.c.id)

# An attempt's error, kept with the rows until one succeeds or they are failed.
NOTE_ERROR = MARK.values(error=bindparam("note"))
# Give up on rows: the reason, and the last attempt's error if one was noted.
FAIL = MARK.values(
    status="failed",
    updated_at=bindparam("at"),
    error=bindparam("reason") + func.coalesce(literal("; last error: ") + inbox.c.error, literal("")),
)


def _status_and_replies() -> Any:
    """What a waiter reads: the event's status and its replies, in one statement.

    The replies are the outbox rows of the event's run, or of the event itself when no
    run is linked; the outer joins give one row with no reply when there is none yet.
    """
    columns = (
        inbox.c.status.label("event_status"),
        outbox.c.id,
        outbox.c.message_id,
        outbox.c.payload,
        outbox.c.status,
    )
    event = inbox.c.event_id == bindparam("e")
    of_run = (
        select(*columns)
        .select_from(inbox.outerjoin(outbox, outbox.c.run_id == inbox.c.run_id))
        .where(event, inbox.c.run_id.is_not(None))
    )
    of_event = (
        select(*columns)
        .select_from(inbox.outerjoin(outbox, outbox.c.event_id == inbox.c.event_id))
        .where(event, inbox.c.run_id.is_(None))
    )
    both = union_all(of_run, of_event).subquery()
    return select(both).order_by(both.c.id)


STATUS_AND_REPLIES = _status_and_replies()

CLAIMABLE = (
    select(inbox.c.session_key)
    .select_from(inbox.outerjoin(session_keys, session_keys.c.key == inbox.c.session_key))
    .where(
        one_of(inbox.c.status, INBOX_UNFINISHED),
        or_(session_keys.c.lease_owner.is_(None), session_keys.c.lease_expires_at < bindparam("now")),
    )
    .group_by(inbox.c.session_key)
    .order_by(func.min(inbox.c.id))
    .limit(bindparam("limit"))
)

ORIGINAL = select(inbox.c.event_id, inbox.c.session_key).where(
    inbox.c.channel == bindparam("ch"), inbox.c.external_id == bindparam("ext")
)

# Ingest: the columns an accepted event's row is stored with.
INGESTED = (
    "event_id",
    "channel",
    "external_id",
    "session_key",
    "payload",
    "status",
    "attempts",
    "created_at",
    "updated_at",
    "trace_context",
)
INSERT_VALUES = {name: bindparam(name, type_=inbox.c[name].type) for name in INGESTED}


def reply_of(message_id: str, payload: dict[str, Any], status: str) -> Reply:
    """A reply as a waiter returns it, from its outbox row's message id, payload and status."""
    parts = payload.get("parts", [])
    text = "\n".join(p.get("text", "") for p in parts if p.get("type") == "text")
    private = bool((payload.get("metadata") or {}).get(PRIVATE_NOTICE_KEY))
    return Reply(message_id=message_id, text=text, parts=parts, status=status, private=private)
