"""PostgreSQL: a turn's memory recall stays an index read however many entries there are.

A pooled connection prepares the recall once and, after five runs, may keep a generic
plan for its whole life, made with the statistics of that moment. Made while the table
was small (a new deployment; autovacuum off and never analysed), the recall over the three
scopes' OR read the whole table on every turn: O(every user's memories) per event. Here
the plan is made while the table is empty, 20,000 entries of other people arrive, and the
same prepared recall must still find this turn's entries by index, and the right ones.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
from sqlalchemy.dialects import postgresql

from app.memory.recall import recall_query
from app.memory.store import GLOBAL_OWNER
from tests.support.pg_probe import asyncpg_dsn

OTHERS = 20_000
LIMIT = 3


def _literal(value: object) -> str:
    if isinstance(value, bool) or value is None:
        raise TypeError(value)
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


async def _add(conn: asyncpg.Connection, rows: list[tuple[str, str, int | None, str, datetime]]) -> None:
    await conn.executemany(
        "INSERT INTO memories (scope, owner, key, content, source_session_id, created_at, updated_at,"
        " metadata, namespace) VALUES ($1, $2, NULL, $4, $3, $5, $5, '{}', '')",
        rows,
    )


async def test_a_recall_planned_on_an_empty_table_reads_by_index(pg_url: str) -> None:
    compiled = recall_query(True).compile(dialect=postgresql.asyncpg.dialect())  # type: ignore[no-untyped-call]
    params = {
        **compiled.params,
        "skey": "webhook:c",
        "ns": "",
        "limit": LIMIT,
        "ident": "webhook:u",
        "sid": 7,
    }
    args = ", ".join(_literal(params[name]) for name in compiled.positiontup or ())
    conn = await asyncpg.connect(asyncpg_dsn(pg_url))
    try:
        await conn.execute("SET plan_cache_mode = force_generic_plan")  # as after five runs
        await conn.execute("PREPARE recall AS " + compiled.string)
        assert await conn.fetch(f"EXECUTE recall({args})") == []  # planned now, on an empty table
        await conn.execute(
            "INSERT INTO memories (scope, owner, key, content, source_session_id, created_at, updated_at,"
            " metadata, namespace) SELECT 'user', 'webhook:other' || g, NULL, 'theirs', NULL, now(), now(),"
            " '{}', '' FROM generate_series(1, $1::int) g",
            OTHERS,
        )
        start = datetime(2026, 1, 1, tzinfo=UTC)
        mine: list[tuple[str, str, int | None, str, datetime]] = []
        for i in range(LIMIT + 2):
            at = start + timedelta(minutes=i)
            mine += [
                ("user", "webhook:u", None, f"user {i}", at),
                ("session", "webhook:c", 7, f"session {i}", at),
                ("global", GLOBAL_OWNER, None, f"global {i}", at),
            ]
        mine.append(("session", "webhook:c", 6, "an earlier generation's", start + timedelta(hours=1)))
        await _add(conn, mine)

        recalled = await conn.fetch(f"EXECUTE recall({args})")
        plan = "\n".join(
            r[0] for r in await conn.fetch(f"EXPLAIN (ANALYZE, COSTS off) EXECUTE recall({args})")
        )
    finally:
        await conn.close()

    newest = [f"{scope} {i}" for i in range(LIMIT + 1, 1, -1) for scope in ("user", "session", "global")]
    assert sorted(r["content"] for r in recalled) == sorted(newest)  # the newest `limit` of each scope
    assert [r["updated_at"] for r in recalled] == sorted((r["updated_at"] for r in recalled), reverse=True)
    assert "Seq Scan on memories" not in plan, plan
