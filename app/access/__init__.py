"""Who may talk to the bot, and how much (docs/access.md).

`AccessGate` decides at ingest, before anything is stored: the channel's access mode
(`open`, `allowlist`, `pairing`) with its static lists and the lists stored in the
database (`AccessStore`), then the quotas (`QuotaCounters`, shared by every replica).
Nothing here imports the pipeline: ingest calls down into this package.
"""

from typing import TYPE_CHECKING

from app.lazy_names import lazy_names

if TYPE_CHECKING:
    from app.access.counters import QuotaCounters
    from app.access.gate import AccessGate, AgentLimits, Verdict, access_mode
    from app.access.limits import QuotaLimits
    from app.access.store import AccessStore, Approved, BadAccessInput

# Loaded on first use (PEP 562): `chatgate` imports this package for its command's parser
# on every start, and the names' modules pull in SQLAlchemy and more.
_EXPORTS = {
    "QuotaCounters": "app.access.counters",
    "AccessGate": "app.access.gate",
    "AgentLimits": "app.access.gate",
    "Verdict": "app.access.gate",
    "access_mode": "app.access.gate",
    "QuotaLimits": "app.access.limits",
    "AccessStore": "app.access.store",
    "Approved": "app.access.store",
    "BadAccessInput": "app.access.store",
}

__getattr__ = lazy_names(__name__, _EXPORTS)


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
