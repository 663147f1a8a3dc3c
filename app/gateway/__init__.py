"""The browser gateway: `WS /ws` protocol, tokens, fan-out across replicas (docs/gateway.md)."""

from __future__ import annotations

from app.bus import LocalSessionBus, SessionBus
from app.config import Settings


def build_session_bus(settings: Settings) -> SessionBus:
    """PostgreSQL LISTEN/NOTIFY across replicas; in-process on SQLite (one process)."""
    from app.gateway.pg_bus import PgSessionBus

    # Run durations and provider errors are observed by the turn handler itself
    # (Runtime._observe_run), not by re-reading run rows from the bus.
    return LocalSessionBus() if settings.is_sqlite else PgSessionBus(settings.database_url)
