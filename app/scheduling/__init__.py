"""Scheduled work: cron jobs and one-shot reminders stored in the database.

The core may depend on this package; it never imports a channel. The cron channel
(`channels/cron`) fires due jobs into the pipeline.
"""

from typing import TYPE_CHECKING

from app.lazy_names import lazy_names

if TYPE_CHECKING:
    from app.scheduling.schedule import InvalidSchedule, check_cron, next_cron_fire, parse_at, zone
    from app.scheduling.store import CronJob, JobStore, Target, UsesJobStore

# Loaded on first use (PEP 562): `chatgate` imports this package for its command's parser
# on every start, and the names' modules pull in SQLAlchemy and more.
_EXPORTS = {
    "InvalidSchedule": "app.scheduling.schedule",
    "check_cron": "app.scheduling.schedule",
    "next_cron_fire": "app.scheduling.schedule",
    "parse_at": "app.scheduling.schedule",
    "zone": "app.scheduling.schedule",
    "CronJob": "app.scheduling.store",
    "JobStore": "app.scheduling.store",
    "Target": "app.scheduling.store",
    "UsesJobStore": "app.scheduling.store",
}

__getattr__ = lazy_names(__name__, _EXPORTS)


__all__ = [
    "CronJob",
    "InvalidSchedule",
    "JobStore",
    "Target",
    "UsesJobStore",
    "check_cron",
    "next_cron_fire",
    "parse_at",
    "zone",
]
