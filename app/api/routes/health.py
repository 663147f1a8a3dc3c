"""Liveness, readiness and metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Response
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import get_runtime
from app.migrate import at_head
from app.runtime import Runtime

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(runtime: Runtime = Depends(get_runtime)) -> JSONResponse:
    """The database answers and its schema is at the newest migration."""
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
    await runtime.refresh_backlog_gauges()
    return Response(runtime.metrics.render(), media_type="text/plain; version=0.0.4")
