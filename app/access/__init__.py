"""Who may talk to the bot, and how much (docs/access.md).

`AccessGate` decides at ingest, before anything is stored: the channel's access mode
(`open`, `allowlist`, `pairing`) with its static lists and the lists stored in the
database (`AccessStore`), then the quotas (`QuotaCounters`, shared by every replica).
Nothing here imports the pipeline: ingest calls down into this package.
"""

from app.access.counters import QuotaCounters
from app.access.gate import AccessGate, AgentLimits, Verdict, access_mode
from app.access.limits import QuotaLimits
from app.access.store import AccessStore, Approved, BadAccessInput

__all__ = [
    "AccessGate",
    "AccessStore",
    "AgentLimits",
    "Approved",
    "BadAccessInput",
    "QuotaCounters",
    "QuotaLimits",
    "Verdict",
    "access_mode",
]
