"""`GET /admin/api/config`: the effective configuration, read-only, secrets redacted."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from app.api.deps import get_runtime, require_admin
from app.config_view import REDACTED, settings_view
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api", tags=["admin dashboard"], dependencies=[Depends(require_admin)])


@router.get("/config")
async def effective_config(runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """The settings this process runs with: the core's and each enabled channel's.

    Every secret (tokens, keys, passwords, a password inside a URL) is replaced by
    `redacted`; an unset value stays null. Nothing here can be changed: settings come
    from the environment (or `.env`) at start-up.
    """
    sections = [{"name": "core", "settings": settings_view(runtime.settings)}]
    for name, channel in sorted(runtime.channel_settings.items()):
        sections.append({"name": name, "settings": settings_view(channel)})
    return {"redacted": REDACTED, "sections": sections}
