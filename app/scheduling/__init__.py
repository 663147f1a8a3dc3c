"""Scheduled work: cron jobs and one-shot reminders stored in the database.

The core may depend on this package; it never imports a channel. The cron channel
(`channels/cron`) fires due jobs into the pipeline.
"""

from app.scheduling.schedule import InvalidSchedule, check_cron, next_cron_fire, parse_at, zone
from app.scheduling.store import CronJob, JobStore, Target, UsesJobStore

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
