"""Tables (SQLAlchemy Core). One schema for PostgreSQL and SQLite.

The hot paths (inbox, history appends, leases) use Core statements rather than the ORM:
they are a handful of fixed queries and the ORM's unit of work would only add cost.

The schema is one `MetaData` (`app.db.base`), its tables written down by family in
`pipeline_tables.py`, `agent_tables.py` and `access_tables.py`; this module is the schema
as Alembic and every reader see it: import tables and helpers from here.
"""

from __future__ import annotations

from app.db.access_tables import (
    access_counters,
    access_entries,
    access_pairings,
    admin_auth_failures,
    alert_incidents,
)
from app.db.agent_tables import (
    agent_choices,
    approvals,
    cron_jobs,
    handoffs,
    identity_links,
    link_codes,
    memories,
    session_senders,
    usage_records,
)
from app.db.base import (
    CANCELED,
    INBOX_UNFINISHED,
    OUTBOX_UNDELIVERED,
    Id,
    UTCDateTime,
    metadata,
    one_of,
    utcnow,
)
from app.db.pipeline_tables import (
    channel_records,
    connection_leases,
    inbox,
    messages,
    outbox,
    pacing_buckets,
    runs,
    session_keys,
    sessions,
    stream_previews,
)

__all__ = [
    "CANCELED",
    "INBOX_UNFINISHED",
    "OUTBOX_UNDELIVERED",
    "Id",
    "UTCDateTime",
    "access_counters",
    "access_entries",
    "access_pairings",
    "admin_auth_failures",
    "agent_choices",
    "alert_incidents",
    "approvals",
    "channel_records",
    "connection_leases",
    "cron_jobs",
    "handoffs",
    "identity_links",
    "inbox",
    "link_codes",
    "memories",
    "messages",
    "metadata",
    "one_of",
    "outbox",
    "pacing_buckets",
    "runs",
    "session_keys",
    "session_senders",
    "sessions",
    "stream_previews",
    "usage_records",
    "utcnow",
]
