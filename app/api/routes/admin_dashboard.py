"""Admin REST API for the dashboard: overview, time series, runs, approvals, channels.

Everything the dashboard (`/admin`) shows comes from here or from `routes/admin.py`;
scripts can use the same endpoints. Same authentication as the rest of `/admin/api`
(bearer ADMIN_TOKEN or the dashboard's session cookie). None of these paths starts
with `/sessions/`, which `routes/admin.py` matches as `{key:key}`.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, Field

from app.api.deps import INT64_MAX, RowId, get_runtime, require_admin
from app.api.routes import keypath as _keypath  # noqa: F401  (registers {key:key})
from app.connection_leases import list_holds
from app.db.models import utcnow
from app.runtime import Runtime
from app.sessions import queries, stats
from channels import KNOWN_CHANNELS

router = APIRouter(prefix="/admin/api", tags=["admin dashboard"], dependencies=[Depends(require_admin)])


class LatencyStats(BaseModel):
    p50: int | None = Field(description="Median run duration (ms) in the window.")
    p95: int | None
    max: int | None
    avg: int | None
    sampled: int = Field(description="Finished runs the percentiles were computed from (newest first).")


class RunStats(BaseModel):
    count: int = Field(description="Runs started in the window.")
    outcomes: dict[str, int] = Field(description="Runs by outcome: ok, running, provider_error, …")
    latency_ms: LatencyStats


class Backlog(BaseModel):
    inbox_pending: int = Field(description="Accepted events not processed yet (pending + processing).")
    outbox_pending: int = Field(description="Replies not delivered yet (pending + sending).")


class Failures(BaseModel):
    inbox_failed: int = Field(description="Events given up on after too many attempts (all time).")
    outbox_failed: int = Field(description="Replies that could not be delivered (all time).")
    runs_failed: int = Field(description="Runs in the window whose outcome is neither ok nor running.")


class Overview(BaseModel):
    generated_at: datetime
    window_minutes: int
    sessions: dict[str, int] = Field(description="Session generations by status.")
    events_in_window: int
    events_per_minute: float = Field(description="Average accepted events per minute over the window.")
    events_last_minute: int
    runs: RunStats
    backlog: Backlog
    failures: Failures
    inbox: dict[str, int] = Field(description="Inbox rows by status.")
    outbox: dict[str, int] = Field(description="Outbox rows by status.")


class SeriesPoint(BaseModel):
    t: datetime = Field(description="Start of the minute (UTC).")
    events: int = Field(description="Events accepted into the inbox.")
    runs: int = Field(description="Agent runs started.")
    run_ms_avg: int | None
    run_ms_max: int | None
    run_failures: int
    sent: int = Field(description="Replies delivered.")
    send_failures: int = Field(description="Replies created in this minute that finally failed.")


class TimeSeries(BaseModel):
    bucket_seconds: int = 60
    since: datetime
    until: datetime
    points: list[SeriesPoint]


class ConnectionHoldInfo(BaseModel):
    """A long-lived platform connection (polling, socket) and the replica holding it."""

    name: str = Field(description="`<channel>:<bot id or token fingerprint>`.")
    owner: str | None = Field(description="The replica (WORKER_ID) holding it, if the lease is live.")
    held_here: bool = Field(description="This process is the owner.")
    fence: int = Field(description="Incremented each time the connection is taken.")
    expires_at: datetime | None
    acquired_at: datetime | None
    takeovers: int = Field(description="Times a replica took it from an owner whose lease expired.")


class ChannelHealth(BaseModel):
    name: str
    enabled: bool = Field(description="An adapter for it runs in this process (CHANNELS).")
    adapter: str | None = Field(description="The adapter's class name.")
    session_scope: str | None
    busy_policy: str | None
    health: str = Field(
        description="ok, idle (no traffic yet), degraded (last delivery failed), "
        "disabled (known channel not in CHANNELS), internal (events from the core, e.g. admin resets)."
    )
    last_inbound_at: datetime | None
    last_outbound_at: datetime | None
    inbound_recent: int = Field(description="Events accepted in the window.")
    outbound_recent: int = Field(description="Replies delivered in the window.")
    inbox_pending: int
    inbox_failed: int
    outbox_pending: int
    outbox_failed: int
    last_error: str | None = Field(description="Newest delivery error recorded for the channel.")
    last_error_at: datetime | None
    connections: list[ConnectionHoldInfo] = Field(
        default_factory=list, description="Its long-lived connections and their owners."
    )


class ChannelList(BaseModel):
    window_minutes: int
    channels: list[ChannelHealth]


def _window(minutes: int) -> tuple[datetime, datetime]:
    now = utcnow()
    return now - timedelta(minutes=minutes), now


@router.get("/overview", response_model=Overview)
async def overview(
    minutes: int = Query(60, ge=1, le=1440, description="Length of the window, in minutes."),
    runtime: Runtime = Depends(get_runtime),
) -> Overview:
    """Counts, throughput, run latency, backlog and failures for the dashboard's first page."""
    since, now = _window(minutes)
    counts = await stats.status_counts(runtime.engine)
    run_stats = await stats.run_stats(runtime.engine, since=since)
    series = await stats.activity_series(runtime.engine, since=since, until=now)
    events = sum(p["events"] for p in series)
    inbox, outbox = counts["inbox"], counts["outbox"]
    outcomes = run_stats["outcomes"]
    return Overview(
        generated_at=now,
        window_minutes=minutes,
        sessions={
            status: counts["sessions"].get(status, 0)
            for status in ("active", "suspended", "expired", "archived")
        }
        | counts["sessions"],
        events_in_window=events,
        events_per_minute=round(events / minutes, 2),
        events_last_minute=series[-1]["events"] if series else 0,
        runs=RunStats(**run_stats),
        backlog=Backlog(
            inbox_pending=inbox.get("pending", 0) + inbox.get("processing", 0),
            outbox_pending=outbox.get("pending", 0) + outbox.get("sending", 0),
        ),
        failures=Failures(
            inbox_failed=inbox.get("failed", 0),
            outbox_failed=outbox.get("failed", 0),
            runs_failed=sum(n for outcome, n in outcomes.items() if outcome not in ("ok", "running")),
        ),
        inbox=inbox,
        outbox=outbox,
    )


@router.get("/timeseries", response_model=TimeSeries)
async def timeseries(
    minutes: int = Query(60, ge=1, le=1440, description="Length of the window, in minutes."),
    runtime: Runtime = Depends(get_runtime),
) -> TimeSeries:
    """Per-minute events, runs, run latency, deliveries and failures (for the small charts)."""
    since, now = _window(minutes)
    points = await stats.activity_series(runtime.engine, since=since, until=now)
    return TimeSeries(since=since, until=now, points=[SeriesPoint(**p) for p in points])


@router.get("/runs")
async def list_runs(
    session_key: str | None = None,
    outcome: str | None = Query(None, description="ok, running, provider_error, max_iterations, …"),
    before_id: int | None = Query(
        None, ge=1, le=INT64_MAX, description="Page backwards: runs with a smaller id."
    ),
    limit: int = Query(100, ge=1, le=1000),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Run traces across all sessions, newest first."""
    return {
        "runs": await queries.list_runs(
            runtime.engine, session_key=session_key, outcome=outcome, before_id=before_id, limit=limit
        )
    }


@router.get("/runs/{run_id}")
async def get_run(run_id: RowId, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """One run trace with the messages it appended (seq, role, tool name) and its approvals."""
    found = await queries.run_detail(runtime.engine, run_id)
    if found is None:
        raise HTTPException(404, f"no run {run_id}")
    return found


@router.get("/approvals")
async def list_approvals(
    status: str | None = Query(None, description="pending, approved, denied, expired …"),
    session_key: str | None = None,
    limit: int = Query(100, ge=1, le=1000),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Approval requests of risky tool calls, newest first, with who decided and when."""
    return {
        "approvals": await queries.list_approvals(
            runtime.engine, status=status, session_key=session_key, limit=limit
        )
    }


@router.get("/session-generations/{key:key}")
async def session_generations(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Every generation of a session key, newest first, marking the current one."""
    generations = await queries.session_generations(runtime.engine, key)
    if not generations:
        raise HTTPException(404, f"no session with key {key!r}")
    return {"key": key, "generations": generations}


@router.get("/channels", response_model=ChannelList)
async def channels(
    minutes: int = Query(60, ge=1, le=10080, description="Window of the recent counts, in minutes."),
    runtime: Runtime = Depends(get_runtime),
) -> ChannelList:
    """Enabled adapters and every channel seen in the inbox/outbox, with their health."""
    since, _ = _window(minutes)
    activity = await stats.channel_activity(runtime.engine, since=since)
    names = sorted(set(runtime.adapters) | set(runtime.channel_settings) | set(activity))
    now = utcnow()
    holds = [
        ConnectionHoldInfo(
            name=h.name,
            owner=h.owner if h.held(now) else None,
            held_here=h.held(now) and h.owner == runtime.owner,
            fence=h.fence,
            expires_at=h.expires_at,
            acquired_at=h.acquired_at,
            takeovers=h.takeovers,
        )
        for h in await list_holds(runtime.engine)
    ]
    out = []
    for name in names:
        act = activity.get(name) or stats.no_activity()
        adapter = runtime.adapters.get(name)
        cs = runtime.channel_settings.get(name)
        enabled = adapter is not None
        # A channel that can say what stops it (e.g. a login that expired) shows that first.
        problem = getattr(adapter, "problem", None)
        said = await problem() if problem is not None else None
        if said is not None:
            act = {**act, "last_error": said, "last_error_at": now}
        out.append(
            ChannelHealth(
                name=name,
                enabled=enabled,
                adapter=type(adapter).__name__ if adapter is not None else None,
                session_scope=cs.session_scope.value if cs is not None else None,
                busy_policy=cs.busy_policy.value if cs is not None else None,
                health="degraded" if said is not None else _health(name, enabled, act),
                connections=[h for h in holds if h.name.startswith(f"{name}:")],
                **act,
            )
        )
    return ChannelList(window_minutes=minutes, channels=out)


def _health(name: str, enabled: bool, act: dict[str, Any]) -> str:
    if not enabled:
        # `admin` (dashboard resets) and similar producers have no adapter by design.
        return "disabled" if name in KNOWN_CHANNELS else "internal"
    error_at, sent_at = act["last_error_at"], act["last_outbound_at"]
    if error_at is not None and (sent_at is None or error_at > sent_at):
        return "degraded"
    if act["last_inbound_at"] is None and sent_at is None:
        return "idle"
    return "ok"
