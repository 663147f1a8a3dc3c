"""What a failover of the primary would keep: its standbys, as `doctor` reports them.

"Acknowledged = never lost" holds across a failover only if the standby promoted had
every commit the primary acknowledged: synchronous replication (`synchronous_commit`
on, the standby named in `synchronous_standby_names`). With asynchronous standbys the
last commits before a crash can be missing on the one promoted (docs/high-availability.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

_STANDBYS = text(
    "SELECT coalesce(application_name, '?') AS name, coalesce(sync_state, '?') AS sync_state"
    " FROM pg_stat_replication ORDER BY 1"
)


@dataclass(frozen=True)
class Replication:
    in_recovery: bool  # connected to a standby, not the primary
    synchronous: tuple[str, ...]  # standbys that confirm commits (sync or quorum)
    asynchronous: tuple[str, ...]  # standbys that may lag (async, potential, unreadable)
    synchronous_commit: str

    def verdict(self) -> tuple[str, str]:
        """("ok" | "warn" | "fail", one line)."""
        if self.in_recovery:
            return "fail", (
                "connected to a standby (read-only): DATABASE_URL must reach the primary; list every"
                " host with target_session_attrs=read-write"
            )
        if self.synchronous and self.synchronous_commit in ("on", "remote_write", "remote_apply"):
            more = f"; asynchronous too: {', '.join(self.asynchronous)}" if self.asynchronous else ""
            return "ok", (
                f"synchronous standby {', '.join(self.synchronous)} (synchronous_commit="
                f"{self.synchronous_commit}): acknowledged events survive a failover to it{more}"
            )
        if self.synchronous or self.asynchronous:
            names = ", ".join(self.synchronous + self.asynchronous)
            return "warn", (
                f"asynchronous standby {names} (synchronous_commit={self.synchronous_commit}):"
                " acknowledged events can be lost on failover; make one synchronous"
                " (synchronous_standby_names)"
            )
        return "ok", "no standby: a failover needs a backup restore; the primary's disk is the only copy"


async def replication(engine: AsyncEngine) -> Replication:
    async with engine.connect() as conn:
        in_recovery = bool((await conn.execute(text("SELECT pg_is_in_recovery()"))).scalar())
        commit = str((await conn.execute(text("SHOW synchronous_commit"))).scalar())
        rows = (await conn.execute(_STANDBYS)).all()
    sync = tuple(r.name for r in rows if r.sync_state in ("sync", "quorum"))
    other = tuple(r.name for r in rows if r.sync_state not in ("sync", "quorum"))
    return Replication(in_recovery, sync, other, commit)
