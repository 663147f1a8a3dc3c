"""PostgreSQL: the statement accepting an event on an idle key starts its turn too.

`accept_start.ACCEPT_STARTING` stores the event, takes the key's free lease and, when its
snapshot is current, the key has nothing else waiting and the session can be continued,
writes the turn's start as `fused.START` would. These tests pin when it starts and when it
must not, the two interleavings it hands to the dispatcher as plain claims (a concurrent
duplicate, a session expired under it), and a start whose worker died.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db import direct
from app.db.engine import autocommit
from app.db.models import inbox, messages, runs, sessions, utcnow
from app.events import InboundEvent
from app.pipeline import fused
from app.pipeline.accept_start import ACCEPT_STARTING
from app.pipeline.inbox import Inbox
from app.pipeline.replies import user_message
from app.sessions import lease as leases
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import Lifecycle, SessionStore
from tests.conftest import ServeApp
from tests.pipeline.test_fused import ANSWERED, _tool_group
from tests.pipeline.test_fused import plan as start_plan
from tests.pipeline.test_lease_fusion import KEY, _turns, lease_of
from tests.support.pg_probe import asyncpg_dsn, while_another_worker_finishes, while_locked


async def _session(engine: AsyncEngine, *history: ChatMessage) -> int:
    """An open session of `KEY` holding `history`, its lease free again; returns its id."""
    store = SessionStore(engine, Lifecycle())
    lease = await leases.acquire(engine, KEY, "setup", ttl=30)
    assert lease is not None
    async with engine.begin() as conn:
        await leases.check_fence(conn, lease)
        session = await store.open_current(conn, KEY, "webhook")
        await store.append(conn, session.id, list(history))
    assert not await leases.release(engine, lease)  # nothing unfinished
    return session.id


async def _accept(
    engine: AsyncEngine,
    text: str,
    *,
    owner: str = "me",
    external_id: str | None = None,
    ttl: float = 30,
    idle_for: timedelta = timedelta(hours=24),
) -> tuple[InboundEvent, fused.StartPlan, Any]:
    """Run the statement as `Inbox.accept` does with a plan; the event, the plan and its row."""
    event = InboundEvent.from_text("webhook", "c", "u", text, external_id=external_id)
    plan = start_plan(event.event_id, text, cutoff=utcnow() - idle_for)
    params = plan.accept_params(Inbox._values(event, plan.now))
    params.update(k=KEY, o=owner, exp=plan.now + timedelta(seconds=ttl))
    async with direct.connect(autocommit(engine)) as conn:
        row = await ACCEPT_STARTING[external_id is not None, None].one(conn, params)
    return event, plan, row


async def _inbox(engine: AsyncEngine) -> list[tuple[str, str, int]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(inbox.c.event_id, inbox.c.status, inbox.c.attempts).order_by(inbox.c.id)
        )
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def _contents(engine: AsyncEngine) -> list[tuple[int, str, str | None]]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            select(messages.c.session_id, messages.c.role, messages.c.content).order_by(
                messages.c.session_id, messages.c.seq
            )
        )
    return [tuple(r) for r in rows]  # type: ignore[misc]


async def _runs(engine: AsyncEngine) -> list[str]:
    async with engine.connect() as conn:
        return list((await conn.execute(select(runs.c.outcome).order_by(runs.c.id))).scalars())


async def test_an_idle_key_with_an_open_session_gets_its_turn_started(pg_engine: AsyncEngine) -> None:
    sid = await _session(pg_engine, *ANSWERED)
    event, plan, row = await _accept(pg_engine, "next")
    assert row["id"] is not None and row["fence"] == 2 and row["go"]
    assert row["upcoming"] == []
    started = plan.started_on_accept(row)
    assert started.session.id == sid and started.seq == 3 and started.session.next_seq == 4
    assert [m.content for m in started.window] == ["hi", "hello"]  # read before the new message
    assert started.started_at == plan.now and started.recalled is None and not started.watched
    assert await _inbox(pg_engine) == [(event.event_id, "processing", 1)]
    assert (await _contents(pg_engine))[-1] == (sid, "user", "next")
    assert await _runs(pg_engine) == ["running"]
    assert await lease_of(pg_engine, KEY) == ("me", 2)
    # What the worker's own start would have read: the same window, then its end writes on.
    store = SessionStore(pg_engine, Lifecycle())
    loaded = await store.load_window(started.session, max_messages=50, max_tokens=None)
    user = user_message(event)
    assert fused.stored_window(started, user)[:-1] == loaded[:-1]
    assert loaded[-1].content == "next" and loaded[-1].seq == started.seq


@pytest.mark.parametrize(
    "case", ["new key", "held", "ours already", "waiting rows", "idle too long", "open tool group"]
)
async def test_the_statement_starts_nothing_when_the_worker_must_decide(
    pg_engine: AsyncEngine, case: str
) -> None:
    """Stored pending, nothing written to the session: the dispatcher's worker starts the turn."""
    if case != "new key":
        history = [*_tool_group(0)[:2]] if case == "open tool group" else list(ANSWERED)
        await _session(pg_engine, *history)
    if case in ("held", "ours already"):
        assert await leases.acquire(pg_engine, KEY, "other" if case == "held" else "me", ttl=30)
    if case == "waiting rows":
        await Inbox(pg_engine).accept([InboundEvent.from_text("webhook", "c", "u", "earlier")])
    before = await _contents(pg_engine)
    event, _, row = await _accept(
        pg_engine, "next", idle_for=timedelta(0) if case == "idle too long" else timedelta(hours=24)
    )
    assert row["id"] is not None and not row["go"] and row["run_id"] is None and row["s_id"] is None
    assert (row["fence"] is None) is (case in ("held", "ours already"))
    if case == "waiting rows":
        assert [r["payload"]["parts"][0]["text"] for r in row["upcoming"]] == ["earlier"]
    assert (event.event_id, "pending", 0) in await _inbox(pg_engine)
    assert await _contents(pg_engine) == before and await _runs(pg_engine) == []


async def test_a_duplicate_is_not_stored_and_starts_nothing(pg_engine: AsyncEngine) -> None:
    await _session(pg_engine, *ANSWERED)
    first, _, row = await _accept(pg_engine, "next", external_id="x-1")
    assert row["go"]
    await leases.release(pg_engine, SessionLease(KEY, "me", row["fence"]))
    async with pg_engine.begin() as conn:  # the first turn ended
        await conn.execute(update(inbox).values(status="done"))
    _, _, again = await _accept(pg_engine, "next", owner="other", external_id="x-1")
    assert again["id"] is None and again["fence"] is None and not again["go"]
    assert await _inbox(pg_engine) == [(first.event_id, "done", 1)]
    assert [c for _, _, c in await _contents(pg_engine)] == ["hi", "hello", "next"]


async def test_a_snapshot_older_than_another_workers_turn_starts_nothing(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """The statement waited for the key's row while another worker took the lease, finished a
    row and released. Its snapshot of the session is stale, so it must not start the turn."""
    await _session(pg_engine, *ANSWERED)
    [accepted] = await Inbox(pg_engine).accept([InboundEvent.from_text("webhook", "c", "u", "first")])
    async with pg_engine.connect() as conn:
        first_id = (await conn.execute(select(inbox.c.id))).scalar_one()
    event, _, row = await while_another_worker_finishes(
        asyncpg_dsn(pg_url), KEY, first_id, lambda: _accept(pg_engine, "next")
    )
    assert row["fence"] == 3 and row["upcoming"] is None and not row["go"] and row["run_id"] is None
    assert (event.event_id, "pending", 0) in await _inbox(pg_engine)
    assert await _runs(pg_engine) == []
    assert accepted.event_id != event.event_id


# An inbox row stored by another replica's transaction, for `_pending_copy`'s arguments.
_INSERT_PENDING = (
    "INSERT INTO inbox (event_id, channel, external_id, session_key, payload, status, attempts,"
    " created_at, updated_at) VALUES ($1, $2, $3, $4, $5::json, 'pending', 0, now(), now())"
)
_EXPIRE = "UPDATE sessions SET status = 'expired' WHERE id = $1"


def _pending_copy(event: InboundEvent) -> tuple[Any, ...]:
    return (event.event_id, event.channel, event.external_id, event.session_key, event.model_dump_json())


async def test_a_duplicate_committed_after_the_snapshot_leaves_the_lease_to_the_claim(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """The snapshot has no row with the external id, so the lease is taken; the insert then
    waits for the other transaction's row and skips. Nothing is started or stored."""
    await _session(pg_engine, *ANSWERED)
    twin = InboundEvent.from_text("webhook", "c", "u", "next", external_id="x-1")
    _, _, row = await while_locked(
        asyncpg_dsn(pg_url),
        [(_INSERT_PENDING, _pending_copy(twin))],
        lambda: _accept(pg_engine, "next", external_id="x-1"),
    )
    assert row["go"]  # decided on the snapshot, before the insert found the duplicate
    assert row["id"] is None and row["fence"] == 2 and row["upcoming"] == []
    assert row["run_id"] is None and await _runs(pg_engine) == []
    assert await _inbox(pg_engine) == [(twin.event_id, "pending", 0)]
    assert [c for _, _, c in await _contents(pg_engine)] == ["hi", "hello"]


async def test_a_session_expired_under_the_statement_starts_nothing(
    pg_engine: AsyncEngine, pg_url: str
) -> None:
    """The snapshot shows the session open; the lifecycle sweep's expiry commits while the
    statement waits for the session's row. It has inserted the row as started, but writes
    nothing to the session."""
    sid = await _session(pg_engine, *ANSWERED)
    event, _, row = await while_locked(
        asyncpg_dsn(pg_url), [(_EXPIRE, [sid])], lambda: _accept(pg_engine, "next")
    )
    assert row["go"] and row["run_id"] is None and row["seq"] is None and row["upcoming"] == []
    assert await _inbox(pg_engine) == [(event.event_id, "processing", 1)]
    assert [c for _, _, c in await _contents(pg_engine)] == ["hi", "hello"] and await _runs(pg_engine) == []


# --- served: what the dispatcher and the worker make of it --------------------------------


async def _history(srv: Any) -> list[tuple[int, str, str | None]]:
    return await _contents(srv.runtime.engine)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_session_expired_under_the_accept_is_answered_in_a_new_one(serve: ServeApp) -> None:
    async with serve() as srv:
        await _turns(srv, "one")
        engine = srv.runtime.engine
        async with engine.connect() as conn:
            sid = (await conn.execute(select(sessions.c.id))).scalar_one()
        event = InboundEvent.from_text("webhook", "c", "u", "two")
        dsn = asyncpg_dsn(srv.runtime.settings.database_url)
        await while_locked(dsn, [(_EXPIRE, [sid])], lambda: srv.runtime.inbox.accept([event]))
        result = await srv.runtime.inbox.wait_for_replies(event.event_id, 10)
        assert result.done and result.replies[0].text
        history = await _history(srv)
        assert [(s == sid, role) for s, role, _ in history] == [
            (True, "user"),
            (True, "assistant"),
            (False, "user"),
            (False, "assistant"),
        ]
        assert history[2][2] == "two"
        assert await _runs(engine) == ["ok", "ok"]
        # Its accept marked it as started (one attempt), and the worker's start again.
        assert [(status, attempts) for _, status, attempts in await _inbox(engine)] == [
            ("done", 1),
            ("done", 2),
        ]


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_duplicate_racing_the_accept_is_answered_once_and_frees_the_lease(serve: ServeApp) -> None:
    async with serve() as srv:
        await _turns(srv, "one")
        engine = srv.runtime.engine
        twin = InboundEvent.from_text("webhook", "c", "u", "two", external_id="x-1")
        copy = InboundEvent.from_text("webhook", "c", "u", "two", external_id="x-1")
        dsn = asyncpg_dsn(srv.runtime.settings.database_url)
        [result] = await while_locked(
            dsn, [(_INSERT_PENDING, _pending_copy(twin))], lambda: srv.runtime.inbox.accept([copy])
        )
        assert result.duplicate and result.event_id == twin.event_id
        replies = await srv.runtime.inbox.wait_for_replies(twin.event_id, 10)
        assert replies.done and len(replies.replies) == 1
        contents = [c for _, _, c in await _history(srv)]
        assert contents == ["one", contents[1], "two", replies.replies[0].text]
        for _ in range(100):
            if not srv.runtime.dispatcher.busy_keys:
                break
            await asyncio.sleep(0.02)
        assert not srv.runtime.dispatcher.busy_keys
        lease = await lease_of(engine, KEY)
        assert lease is not None and lease[0] is None  # the claim's drain released it


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
async def test_a_turn_whose_accepting_replica_died_is_run_again_once(
    engine: AsyncEngine, serve: ServeApp
) -> None:
    """The accept started the turn, and its replica died before the worker ran it. Another
    replica takes the expired lease and treats the row as the retry it is: the user message
    is not appended twice, and the dead run is marked crashed."""
    await _session(engine, *ANSWERED)
    event, _, row = await _accept(engine, "next", owner="dead", ttl=0.2)
    assert row["go"] and row["run_id"] is not None
    await asyncio.sleep(0.3)
    async with serve() as srv:
        result = await srv.runtime.inbox.wait_for_replies(event.event_id, 10)
        assert result.done and result.replies[0].text
    assert [(role, c) for _, role, c in await _contents(engine)] == [
        ("user", "hi"),
        ("assistant", "hello"),
        ("user", "next"),
        ("assistant", result.replies[0].text),
    ]
    assert await _runs(engine) == ["crashed", "ok"]
    assert await _inbox(engine) == [(event.event_id, "done", 2)]
