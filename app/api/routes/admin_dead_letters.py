"""`/admin/api/dead-letters`: failed events and deliveries, retried once more or discarded.

Same authentication as the rest of `/admin/api`. Ids are `inbox:<n>` and `outbox:<n>`.
A retry or discard by filter needs at least one condition, or `"all": true`, so an
empty body never resolves everything by accident.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import ConfigDict, Field, StrictBool

from app.api.bodies import RequestBody
from app.api.deps import get_runtime, require_admin
from app.dead_letters import BadDeadLetterId, DeadLetterFilter, Resolved, parse_id
from app.dead_letters.store import Kind
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api", tags=["dead letters"], dependencies=[Depends(require_admin)])


class Selection(RequestBody):
    """Which dead letters to act on: ids, or a filter, or all of them."""

    model_config = ConfigDict(extra="forbid")

    ids: list[str] = Field(default_factory=list, max_length=1000)
    kind: Kind | None = None
    channel: str | None = None
    session_key: str | None = None
    error_contains: str | None = None
    failed_before: datetime | None = None
    failed_after: datetime | None = None
    # Strict: `"all": 1` or `"all": "yes"` is a 422, never a yes to resolving everything.
    all: StrictBool = Field(False, description="Needed to act on every dead letter without a condition.")

    def to_filter(self) -> DeadLetterFilter:
        f = DeadLetterFilter(
            kind=self.kind,
            ids=tuple(self.ids),
            channel=self.channel,
            session_key=self.session_key,
            error_contains=self.error_contains,
            failed_before=self.failed_before,
            failed_after=self.failed_after,
        )
        if f.is_empty() and not self.all:
            raise HTTPException(400, 'give ids or a filter, or "all": true')
        return _checked(f)


def _checked(f: DeadLetterFilter) -> DeadLetterFilter:
    try:
        for one in f.ids:
            parse_id(one)
    except BadDeadLetterId as exc:
        raise HTTPException(400, str(exc)) from exc
    return f


def _ids(items: list[Resolved]) -> list[str]:
    return [item.id for item in items]


@router.get("/dead-letters")
async def list_dead_letters(
    kind: Kind | None = None,
    channel: str | None = None,
    session_key: str | None = None,
    error_contains: str | None = Query(None, description="Substring of the error"),
    failed_before: datetime | None = None,
    failed_after: datetime | None = None,
    limit: int = Query(100, ge=1, le=1000),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Failed events and deliveries nobody acted on yet, newest failure first, with counts."""
    f = DeadLetterFilter(
        kind=kind,
        channel=channel,
        session_key=session_key,
        error_contains=error_contains,
        failed_before=failed_before,
        failed_after=failed_after,
    )
    return {
        "dead_letters": await runtime.dead_letters.search(f, limit=limit),
        "counts": await runtime.dead_letters.counts(),
    }


@router.post("/dead-letters/retry")
async def retry_dead_letters(selection: Selection, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Give the selected dead letters exactly one more attempt through the ordinary way."""
    return {"retried": _ids(await runtime.retry_dead_letters(selection.to_filter()))}


@router.post("/dead-letters/discard")
async def discard_dead_letters(
    selection: Selection, runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Mark the selected dead letters discarded: never run, and prunable by retention."""
    return {"discarded": _ids(await runtime.dead_letters.discard(selection.to_filter()))}


def _one(letter_id: str) -> DeadLetterFilter:
    return _checked(DeadLetterFilter(ids=(letter_id,)))


@router.post("/dead-letters/{letter_id}/retry")
async def retry_dead_letter(letter_id: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """One dead letter, once more; 404 when it is not (or no longer) a dead letter."""
    done = await runtime.retry_dead_letters(_one(letter_id))
    if not done:
        raise HTTPException(404, f"{letter_id} is not a dead letter (resolved already, or unknown)")
    return {"retried": _ids(done)}


@router.post("/dead-letters/{letter_id}/discard")
async def discard_dead_letter(letter_id: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Discard one dead letter; 404 when it is not (or no longer) a dead letter."""
    done = await runtime.dead_letters.discard(_one(letter_id))
    if not done:
        raise HTTPException(404, f"{letter_id} is not a dead letter (resolved already, or unknown)")
    return {"discarded": _ids(done)}
