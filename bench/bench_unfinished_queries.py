"""The queries that look for unfinished rows, over tens of thousands of dead row versions.

    .venv/bin/python -m bench.bench_unfinished_queries [--events 40000] [--unfinished 200] [--runs 5]

A soak with autovacuum off (as on the shared machines' cluster) leaves every finished
event's earlier row versions in the inbox and outbox, and the planner's statistics as
they were when the tables were small. This builds that state on a throw-away PostgreSQL
database: the tables analysed while small, autovacuum off on them, then `--events` inbox
and outbox rows taken through their statuses as the pipeline does, in batches of 500
(inbox pending → processing → done, outbox pending → sending → sent), leaving
`--unfinished` of each unfinished. Then it times (EXPLAIN ANALYZE, the median of
`--runs`) each statement that looks for unfinished rows, as the stores run them (and the
outbox claim as it was before, with `NOT EXISTS`), on a database at the migration head
and on one at `0017_session_senders` (the indexes before the partial ones), each churned
the same way, and prints the indexes each plan used.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
from typing import Any

from alembic import command
from sqlalchemy import and_, bindparam, exists, or_, select, text, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.ext.asyncio import AsyncConnection, create_async_engine
from sqlalchemy.orm import aliased

from app.db.models import OUTBOX_UNDELIVERED, one_of, outbox
from app.migrate import alembic_config
from app.pipeline.storage import inbox_queries as q
from app.pipeline.storage import pg_inbox
from app.pipeline.storage.outbox_claim import claim_statement
from tests.support.db import postgres_database

# One batch of events taken through their statuses (`{lo}`..`{hi}`), a statement per step
# as the pipeline's, each committed: every step leaves a dead version of each row.
_CHURN = (
    "INSERT INTO inbox (event_id, channel, external_id, session_key, payload, status, attempts,"
    " created_at, updated_at) SELECT 'e' || g, 'webhook', 'x' || g, 'webhook:s' || (g % 1000), '{{}}',"
    " 'pending', 0, now(), now() FROM generate_series({lo}, {hi}) g",
    "UPDATE inbox SET status = 'processing', attempts = 1 WHERE status = 'pending' AND event_id LIKE 'e%'",
    "UPDATE inbox SET status = 'done' WHERE status = 'processing'",
    "INSERT INTO outbox (message_id, session_key, channel, chat_id, payload, status, attempts,"
    " next_attempt_at, created_at) SELECT 'm' || g, 'webhook:s' || (g % 1000), 'webhook', 's', '{{}}',"
    " 'pending', 0, now(), now() FROM generate_series({lo}, {hi}) g",
    "UPDATE outbox SET status = 'sending', attempts = 1, claimed_until = now() WHERE status = 'pending'",
    "UPDATE outbox SET status = 'sent', sent_at = now(), claimed_until = NULL WHERE status = 'sending'",
)


async def _churn(conn: AsyncConnection, first: int, last: int, batch: int = 500) -> None:
    for lo in range(first, last + 1, batch):
        for step in _CHURN:
            await conn.execute(text(step.format(lo=lo, hi=min(lo + batch - 1, last))))


_UNFINISHED = """
INSERT INTO inbox
  (event_id, channel, external_id, session_key, payload, status, attempts, created_at, updated_at)
  SELECT 'u' || g, 'webhook', 'y' || g, 'webhook:s' || (g % 100), '{{}}', 'pending', 0, now(), now()
  FROM generate_series(1, {n}) g;
INSERT INTO outbox
  (message_id, session_key, channel, chat_id, payload, status, attempts, next_attempt_at, created_at)
  SELECT 'n' || g, 'webhook:s' || (g % 100), 'webhook', 's', '{{}}', 'pending', 0, now(), now()
  FROM generate_series(1, {n}) g;
"""


def _sql(statement: Any, params: dict[str, Any]) -> str:
    """The statement as PostgreSQL text with `params` written in (what a custom plan sees)."""
    compiled = statement.compile(dialect=postgresql.dialect())
    values = {**{k: v.value for k, v in compiled.binds.items()}, **params}

    def literal(match: re.Match[str]) -> str:
        value = values[match.group(1)]
        return str(value) if isinstance(value, int) else "'" + str(value).replace("'", "''") + "'"

    return re.sub(r"%\((\w+)\)s", literal, str(compiled))


def _not_exists_claim() -> Any:
    """The outbox claim as it was before (an earlier undelivered row of the key as NOT EXISTS)."""
    earlier = aliased(outbox)
    now: Any = bindparam("now")
    due = or_(
        and_(outbox.c.status == "pending", outbox.c.next_attempt_at <= now),
        and_(outbox.c.status == "sending", outbox.c.claimed_until < now),
    )
    blocked = exists().where(
        earlier.c.session_key == outbox.c.session_key,
        earlier.c.id < outbox.c.id,
        one_of(earlier.c.status, OUTBOX_UNDELIVERED),
    )
    candidates = (
        select(outbox.c.id)
        .where(due, ~blocked, one_of(outbox.c.channel, ("webhook",)))
        .order_by(outbox.c.id)
        .limit(bindparam("limit"))
        .with_for_update(skip_locked=True)
    )
    return (
        update(outbox)
        .where(outbox.c.id.in_(candidates.scalar_subquery()))
        .values(status="sending", claimed_until=bindparam("until"), attempts=outbox.c.attempts + 1)
        .returning(outbox)
    )


def _statements() -> dict[str, str]:
    claim = claim_statement(True, ("webhook",)).statement
    claim_params = {"now": "2100-01-01", "until": "2100-01-01", "limit": 100}
    return {
        "inbox: a key's next rows (NEXT)": _sql(pg_inbox.NEXT_ROWS, {"k": "webhook:s7", "limit": 2}),
        "inbox: claimable keys": _sql(q.CLAIMABLE, {"now": "2000-01-01", "limit": 100}),
        "outbox: claim due replies": _sql(claim, claim_params),
        "outbox: claim, before (NOT EXISTS form)": _sql(_not_exists_claim(), claim_params),
    }


async def _explain(conn: AsyncConnection, sql: str, runs: int, show: bool = False) -> tuple[float, str]:
    times, indexes, plan = [], "", []
    for _ in range(runs):
        transaction = await conn.begin()
        plan = [r[0] for r in await conn.execute(text("EXPLAIN (ANALYZE, BUFFERS) " + sql))]
        await transaction.rollback()
        times.append(float(re.search(r"Execution Time: ([\d.]+)", plan[-1]).group(1)))  # type: ignore[union-attr]
        indexes = ", ".join(sorted(set(re.findall(r"(?:using|on) (ix_\w+|\w+_pkey)", "\n".join(plan)))))
    if show:
        print("\n".join(plan))
    return statistics.median(times), indexes or "no index"


async def _one_schema(schema: str, args: argparse.Namespace) -> None:
    """Churn a database of `schema` ("head" or a revision to go down to first), then time."""
    async with postgres_database() as url:
        if schema != "head":
            await asyncio.to_thread(command.downgrade, alembic_config(url), schema)
        engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
        explaining = create_async_engine(url)  # each EXPLAIN ANALYZE in a transaction rolled back
        try:
            async with engine.connect() as conn:
                for table in ("inbox", "outbox"):
                    await conn.execute(text(f"ALTER TABLE {table} SET (autovacuum_enabled = off)"))
                await _churn(conn, 1, 100)
                for table in ("inbox", "outbox"):
                    await conn.execute(text(f"ANALYZE {table}"))  # the statistics of a small table
                await _churn(conn, 101, 100 + args.events)
                for insert in _UNFINISHED.format(n=args.unfinished).split(";")[:2]:
                    await conn.execute(text(insert))
                dead = (
                    await conn.execute(
                        text(
                            "SELECT relname, n_dead_tup, pg_total_relation_size(relid)"
                            " FROM pg_stat_user_tables WHERE relname IN ('inbox', 'outbox') ORDER BY relname"
                        )
                    )
                ).all()
            print(
                f"schema {schema}: {args.events} events churned, {args.unfinished} unfinished rows each; "
                + "; ".join(
                    f"{name}: {n} dead row versions, {size / 2**20:.1f} MiB" for name, n, size in dead
                )
            )
            async with explaining.connect() as conn:
                for name, sql in _statements().items():
                    ms, used = await _explain(conn, sql, args.runs, args.plans)
                    print(f"  {name:44} {ms:9.3f} ms   {used}")
        finally:
            await engine.dispose()
            await explaining.dispose()


async def main_async(args: argparse.Namespace) -> None:
    for schema in ("head", "0017_session_senders"):
        await _one_schema(schema, args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=40000)
    parser.add_argument("--unfinished", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--plans", action="store_true", help="print each plan")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
