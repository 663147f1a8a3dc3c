"""PostgreSQL: the statement that accepts an event on an idle key also starts its turn.

A lone event on a key nobody works on costs three statements: its accept (which takes the
key's lease, `prefetch.ACCEPT_TAKING`), the turn's start (`fused.START`) and its end. When
the accepting replica has a run slot for the key, started a turn of it lately, and the
event would start a plain turn (`TurnHandler.start_plan`), `ACCEPT_STARTING` does the
start's writes and reads as well:
the user message, the run row, the session marked active, the history window and the
memory recall. The worker then goes straight to the model.

It starts the turn only when its snapshot shows all of this:

- the lease was free at the fence just below the one it takes (`prefetch.nobody_between`):
  nobody wrote under the lease since the snapshot, so what it read of the session and its
  messages is current;
- the key has no unfinished rows: the event is next in line;
- the key's current session can be continued (`fused.continue_session`); opening a new
  generation points the key's row at it, and one statement may not update that row twice
  (it is the row the lease take updates).

The inbox row is then inserted as `processing` with one attempt, as the start would have
marked it. So the insert depends on the lease take, and the take cannot depend on the
insert (as `ACCEPT_TAKING`'s does, to take nothing for a duplicate): for a deduplicated
event the take goes by whether the snapshot holds its external id already. The start's
writes depend on both. Two rare interleavings follow, and both hand the lease to the
dispatcher as a plain claim:

- a concurrent duplicate committed after the snapshot: nothing is stored, the lease was
  taken for nothing, and the dispatcher's drain finds no rows and releases it;
- the session changed after the snapshot in a way that stops the continue (the lifecycle
  sweep expired it): the row is `processing` with one attempt but nothing was written for
  it, and the worker starts the turn as for any pending row.

Otherwise the statement is `ACCEPT_TAKING`'s, with its result columns (`id`, `fence`,
`upcoming`); `fused.StartPlan` names its parameters and reads what it started. It
commits durably, like any ingest.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import and_, bindparam, case, literal, select, true

from app.db.direct import Direct
from app.db.models import inbox, runs, session_keys, sessions
from app.db.upsert import insert_for, insert_ignore_for
from app.pipeline.fused import (
    ACCEPTED,
    ACCEPTED_PREFIX,
    RUN_FIELDS,
    STARTED_PREFIX,
    continuable,
    continue_session,
    first_reads,
    insert_message,
    typed_params,
)
from app.pipeline.inbox import unfinished_rows
from app.pipeline.prefetch import nobody_between, rows_if_nobody_between, take_if_free

_K = session_keys.c


def _accept_starting(dedup: bool, recall: bool | None) -> Any:
    key = bindparam("k", type_=_K.key.type)
    if dedup:
        seen = (
            select(inbox.c.id)
            .where(
                inbox.c.channel == bindparam(ACCEPTED_PREFIX + "channel"),
                inbox.c.external_id == bindparam(ACCEPTED_PREFIX + "external_id"),
            )
            .exists()
        )
        taken = take_if_free(key, when=~seen)
    else:
        taken = take_if_free(key, when=true())
    current = select(_K.current_session_id).where(_K.key == key).scalar_subquery()  # the snapshot's
    can_continue = select(sessions.c.id).where(*continuable(current)).exists()
    go = (
        select(
            and_(
                select(taken.c.lease_fence).where(nobody_between(taken, key)).exists(),
                ~unfinished_rows(key).exists(),
                can_continue,
            ).label("go")
        )
        .cte("go")
        .prefix_with("MATERIALIZED")
    )
    going = select(go.c.go).scalar_subquery()
    values: dict[str, Any] = {
        name: bindparam(ACCEPTED_PREFIX + name, type_=inbox.c[name].type) for name in ACCEPTED
    }
    values["status"] = case((going, "processing"), else_="pending")
    values["attempts"] = case((going, 1), else_=0)
    store = (
        insert_ignore_for("postgresql", inbox, ["channel", "external_id"])
        if dedup
        else insert_for("postgresql", inbox)
    )
    stored = store.values(values).returning(inbox.c.id).cte("stored")
    bump = continue_session(current, going, select(stored.c.id).exists())
    message = insert_message(bump)
    run = (
        insert_for("postgresql", runs)
        .from_select(list(RUN_FIELDS), select(bump.c.id, *typed_params(runs, "r_", RUN_FIELDS[1:])))
        .returning(runs.c.id)
        .cte("run")
    )
    one = select(literal(1).label("one")).subquery("one")  # a row even when nothing started
    return select(
        select(stored.c.id).scalar_subquery().label("id"),
        select(taken.c.lease_fence).scalar_subquery().label("fence"),
        rows_if_nobody_between(taken, key).label("upcoming"),
        going.label("go"),
        select(taken.c.watched).scalar_subquery().label("watched"),
        *[bump.c[c.name].label(STARTED_PREFIX + c.name) for c in sessions.c],
        select(message.c.seq).scalar_subquery().label("seq"),
        select(run.c.id).scalar_subquery().label("run_id"),
        *first_reads(bump, recall),
    ).select_from(one.outerjoin(bump, true()))


# By whether the event has an external id to deduplicate on, and the plan's recall variant.
ACCEPT_STARTING = {
    (dedup, recall): Direct(_accept_starting(dedup, recall))
    for dedup in (True, False)
    for recall in (None, False, True)
}
