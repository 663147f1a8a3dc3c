"""The `runs` row of an agent run: its values at the start, and the trace written as it goes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import bindparam, update

from app.agent.loop import RunRecord
from app.db.models import runs
from app.events import InboundEvent

# The run row's trace: the values come with the parameters, the run's id as `run_id_`.
UPDATE_RUN = update(runs).where(runs.c.id == bindparam("run_id_"))

RunRow = tuple[list[str], dict[str, Any], datetime]
"""A run row's event ids, details and start, as stored."""


def run_values(
    key: str, events: Sequence[InboundEvent], now: datetime, *, provider: str, model: str | None
) -> tuple[dict[str, Any], RunRow]:
    """A new run row's values but its session id, and what a turn keeps of them."""
    event_ids = [e.event_id for e in events]
    details = {"origin_event_id": events[-1].event_id, "requester": events[-1].sender_id}
    values = dict(
        session_key=key,
        event_ids=event_ids,
        provider=provider,
        model=model,
        tool_calls=[],
        started_at=now,
        outcome="running",
        details=details,
        iterations=0,
        prompt_tokens=0,
        completion_tokens=0,
    )
    return values, (event_ids, details, now)


def run_trace(
    stored: RunRow, record: RunRecord, event_ids: Sequence[str], *, finished: bool, now: datetime
) -> dict[str, Any]:
    """The run row's new values: `stored` as it is, plus what `record` and the turn's events add."""
    stored_ids, stored_details, started_at = stored
    values: dict[str, Any] = dict(
        model=record.model,
        tool_calls=record.tool_calls,
        iterations=record.iterations,
        prompt_tokens=record.prompt_tokens,
        completion_tokens=record.completion_tokens,
        outcome=record.outcome,
        error=record.error,
        details={**stored_details, **record.trace_details()},
        event_ids=[*stored_ids, *(e for e in event_ids if e not in stored_ids)],
        finished_at=None,
        duration_ms=None,
    )
    if finished:
        values["finished_at"] = now
        values["duration_ms"] = round((now - started_at).total_seconds() * 1000)
    return values


def record_of(run: Mapping[Any, Any]) -> RunRecord:
    """The record of a paused run, from its row, to continue it."""
    details = dict(run["details"] or {})
    return RunRecord(
        provider=run["provider"],
        model=run["model"],
        iterations=run["iterations"],
        prompt_tokens=run["prompt_tokens"],
        completion_tokens=run["completion_tokens"],
        tool_calls=list(run["tool_calls"] or []),
        model_ms=int(details.pop("model_ms", 0)),
        tool_ms=int(details.pop("tool_ms", 0)),
        details=details,
    )
