"""Storage: the engine, the session generations, the pipeline's store (chosen once), the
stored cron jobs and the session bus."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncEngine

from app.assembly.record import Built
from app.bus import LocalSessionBus, SessionBus
from app.channel import ChannelSettings
from app.config import Settings
from app.db.engine import create_engine
from app.pg_bus import PgSessionBus
from app.pipeline.storage import build_store
from app.pipeline.storage.port import PipelineStore
from app.scheduling import JobStore
from app.sessions.store import Lifecycle, SessionStore

# Wraps the store once it is chosen (tests record which port operations ran).
StoreWrapper = Callable[[PipelineStore], PipelineStore]


@dataclass(frozen=True, eq=False)  # compared by identity, as `Parts` is
class Storage:
    engine: AsyncEngine
    jobs: JobStore
    sessions: SessionStore
    store: PipelineStore
    bus: SessionBus


def lifecycles(settings: Settings, channel_settings: Mapping[str, ChannelSettings]) -> dict[str, Lifecycle]:
    """Each channel's session lifecycle: its own settings, else the service's."""
    return {
        name: Lifecycle(
            suspend_after=cs.suspend_after_seconds or settings.suspend_after_seconds,
            expire_after=cs.expire_after_seconds or settings.expire_after_seconds,
            archive_after=cs.archive_after_seconds or settings.archive_after_seconds,
        )
        for name, cs in channel_settings.items()
    }


def build_storage(
    built: Built,
    settings: Settings,
    channel_settings: Mapping[str, ChannelSettings],
    wrap_store: StoreWrapper | None = None,
) -> Storage:
    engine = built.part("engine", create_engine(settings))
    jobs = built.part("jobs", JobStore(engine))  # the cron channel fires them, the agent schedules them
    default = Lifecycle(
        settings.suspend_after_seconds, settings.expire_after_seconds, settings.archive_after_seconds
    )
    sessions = built.part("sessions", SessionStore(engine, default, lifecycles(settings, channel_settings)))
    # The pipeline's storage, chosen once (`app.pipeline.storage`).
    store = build_store(engine, sessions, lease_ttl=settings.lease_ttl_seconds, kind=settings.pipeline_store)
    store = built.part("store", wrap_store(store) if wrap_store is not None else store)
    # PostgreSQL LISTEN/NOTIFY across replicas; in-process on SQLite (one process).
    # The bus on its own direct connection (BUS_DATABASE_URL, for poolers) or DATABASE_URL.
    bus: SessionBus = LocalSessionBus() if settings.is_sqlite else PgSessionBus(settings.bus_url)
    return Storage(engine, jobs, sessions, store, built.part("bus", bus))
