"""Admin REST API for usage and cost (bearer ADMIN_TOKEN): `/admin/api/usage` and
`/admin/api/usage/budgets` (the dashboard's usage page reads both)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Query

from app.api.deps import get_runtime, require_admin
from app.runtime import Runtime
from app.usage.report import budget_use, usage_by

router = APIRouter(prefix="/admin/api", tags=["admin: usage"], dependencies=[Depends(require_admin)])


@router.get("/usage")
async def usage(
    group: Literal["day", "session", "model", "sender", "chat", "channel", "agent"] = Query(
        "day", description="What to total by."
    ),
    days: int = Query(30, ge=1, le=366, description="The last N UTC days, today included."),
    channel: str | None = Query(None, description="Only this channel's usage."),
    limit: int = Query(50, ge=1, le=1000),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Model calls, input/output/cached tokens, transcribed seconds and cost, totalled by
    day, session, model, sender, chat, channel or agent (everything but days: most tokens
    first)."""
    rows = await usage_by(runtime.engine, group, days=days, limit=limit, channel=channel or None)
    return {
        "group": group,
        "days": days,
        "channel": channel or None,
        "currency": runtime.usage.settings.currency,
        "rows": rows,
    }


@router.get("/usage/budgets")
async def budgets(
    top: int = Query(5, ge=1, le=100, description="Subjects shown per sender/chat/agent budget."),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Each configured budget (`USAGE_BUDGETS`) with its use in the current UTC day or
    month: the deployment, or the senders, chats or agents nearest their limit."""
    return {
        "currency": runtime.usage.settings.currency,
        "budgets": await budget_use(runtime.engine, runtime.usage.budgets, top=top),
    }
