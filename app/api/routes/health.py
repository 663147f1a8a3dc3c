"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import get_runtime
from app.db.outage import unreachable
from app.migrate import at_head
from app.runtime import Runtime

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: Runtime = Depends(get_runtime)) -> JSONResponse:
    """The database answers and its schema is at the newest migration (and no SIGTERM came)."""
    if runtime.handover.stopping:  # load balancers stop sending here (`app.shutdown`)
        return JSONResponse({"status": "stopping", "reason": "handing work over"}, status_code=503)
    try:
        async with runtime.engine.connect() as conn:
            await conn.execute(text("SELECT 1"))
        migrated = await at_head(runtime.engine)
    except Exception as exc:
        return JSONResponse({"status": "unavailable", "reason": f"database: {exc}"}, status_code=503)
    if not migrated:
        return JSONResponse({"status": "unavailable", "reason": "migrations not at head"}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
async def metrics(runtime: Runtime = Depends(get_runtime)) -> Response:
    """Prometheus metrics."""
    try:
        await runtime.refresh_backlog_gauges()
    except Exception as exc:
        if not unreachable(exc):
            raise
        # The database is away: the process's own metrics still answer (backlog gauges
        # keep their last values), so an outage does not blind the scraper too.
    return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")
