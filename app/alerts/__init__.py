"""Alerts that arrive once (docs/alerts.md): incidents the gateway detects itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from app.alerts.monitor import AlertMonitor, AlertNotifier, Incidents
from app.alerts.settings import AlertSettings
from app.channel import ConnectionConflicts, ReportsConflicts

__all__ = [
    "AlertMonitor",
    "AlertNotifier",
    "AlertSettings",
    "Incidents",
    "build_monitor",
    "connection_conflicts",
]


def build_monitor(settings: AlertSettings, runtime: Any, http: httpx.AsyncClient) -> AlertMonitor | None:
    """The monitor of a running server, or None when no alert destination is set."""
    if not settings.enabled:
        return None
    notifier = AlertNotifier(settings, runtime.engine, http, on_outbox=runtime.sender.notify)
    return AlertMonitor(
        settings,
        runtime.engine,
        notifier,
        served=set(runtime.adapters),
        owner=runtime.owner,
        conflicts=lambda: connection_conflicts(runtime.adapters),
    )


def connection_conflicts(adapters: Mapping[str, Any]) -> dict[str, ConnectionConflicts]:
    """What each adapter whose connection this replica runs says of conflicts."""
    out: dict[str, ConnectionConflicts] = {}
    for name, adapter in adapters.items():
        if isinstance(adapter, ReportsConflicts) and (seen := adapter.connection_conflicts()) is not None:
            out[name] = seen
    return out
