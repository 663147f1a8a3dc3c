"""The port's operations for commands, steering and the outbox (`PipelineStore`).

Commands (/new, /title, /stop, /approve …), a steered message joining a run, a run pausing
for an approval and the outbox sender write through these named operations, never through
a connection of their own: each is one fenced transaction here, so what a command may do to
the database is listed on the port, and a test can see which operation ran. Both stores
share them (`PostgresStore` has nothing faster for such rare writes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.db import direct
from app.db.models import approvals, outbox, runs, sessions, utcnow
from app.events import InboundEvent
from app.memory.generations import next_generation
from app.pipeline.approvals import ApprovalRules, Decided, NoDecision, cancel_pending, decide, insert_request
from app.pipeline.run_trace import UPDATE_RUN
from app.pipeline.storage import inbox_queries as q
from app.pipeline.storage import pacing_queries
from app.pipeline.storage.history import close_open_group
from app.pipeline.storage.native_reads import NativeReads
from app.pipeline.storage.outbox_claim import claim_statement
from app.pipeline.storage.port import InboxRow
from app.pipeline.storage.records import (
    Answer,
    ApprovalRequest,
    Injected,
    MetadataChange,
    OpenSession,
    OutboxClaim,
    PaceGrant,
    PaceTake,
    PausedRun,
)
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState, SessionStore

_INSERT_OUTBOX = outbox.insert()
_PENDING = approvals.c.status == "pending"


class Operations(NativeReads):
    """The operations, on a store's engine and its fenced transactions (`PortableStore`)."""

    engine: AsyncEngine
    reader: AsyncEngine  # one statement, no BEGIN/COMMIT
    skip_locked: bool  # claims pass over rows other replicas are claiming (PostgreSQL)

    @property
    def sessions(self) -> SessionStore:
        raise NotImplementedError

    def fenced(self, lease: SessionLease) -> AbstractAsyncContextManager[AsyncConnection]:
        raise NotImplementedError

    async def _answered(self, conn: AsyncConnection, answer: Answer, session_id: int | None) -> None:
        for reply in answer.replies:
            values = dict(reply)
            if values.get("session_id") is None:
                values["session_id"] = session_id
            await conn.execute(_INSERT_OUTBOX, values)
        if answer.row_ids:
            done: dict[str, Any] = {"ids": list(answer.row_ids), "status": "done", "updated_at": utcnow()}
            if answer.link is not None:
                done["run_id"] = answer.link
            await conn.execute(q.MARK, done)

    # --- during a turn ----------------------------------------------------------------

    async def inject(
        self,
        lease: SessionLease,
        session_id: int,
        rows: Sequence[InboxRow],
        messages: Sequence[ChatMessage],
        *,
        run_id: int | None,
    ) -> Injected:
        async with self.fenced(lease) as conn:
            mark = {"ids": [r.id for r in rows], "status": "processing", "run_id": run_id}
            counted = {r[0] for r in await conn.execute(q.COUNT_UNFINISHED, {**mark, "updated_at": utcnow()})}
            added = [
                message
                for row, message in zip(rows, messages, strict=True)
                if row.id in counted
                and (row.attempts == 0 or not await self.sessions.has_event(conn, session_id, row.event_id))
            ]
            seqs = await self.sessions.append(conn, session_id, added, run_id=run_id)
        return Injected([r.id for r in rows if r.id in counted], added, seqs)

    async def pause_for_approval(
        self,
        lease: SessionLease,
        request: ApprovalRequest,
        answer: Callable[[int], Answer],
        trace: Mapping[str, Any],
    ) -> int:
        async with self.fenced(lease) as conn:
            approval_id = await insert_request(
                conn,
                session_id=request.session_id,
                key=lease.key,
                run_id=request.run_id,
                call_id=request.call_id,
                name=request.name,
                arguments=request.arguments,
                requested_at=request.requested_at,
                expires_at=request.expires_at,
            )
            await self._answered(conn, answer(approval_id), request.session_id)
            await conn.execute(UPDATE_RUN, {**trace, "run_id_": request.run_id})
        return approval_id

    async def next_generation(
        self,
        lease: SessionLease,
        old: SessionState,
        channel: str,
        *,
        reason: str,
        run_id: int | None = None,
        carry: Sequence[ChatMessage] = (),
        answer: Callable[[SessionState, int], Answer] | None = None,
    ) -> tuple[SessionState, int, list[int]]:
        async with self.fenced(lease) as conn:
            new, carried = await next_generation(
                conn, self.sessions, lease, old, channel, reason=reason, run_id=run_id
            )
            seqs = await self.sessions.append(conn, new.id, list(carry), run_id=run_id) if carry else []
            if answer is not None:
                await self._answered(conn, answer(new, carried), new.id)
        return new, carried, seqs

    # --- commands -----------------------------------------------------------------------

    async def answer(self, lease: SessionLease, answer: Answer) -> None:
        async with self.fenced(lease) as conn:
            await self._answered(conn, answer, None)

    async def open_session(self, lease: SessionLease, channel: str) -> OpenSession:
        async with self.fenced(lease) as conn:
            session = await self.sessions.open_current(conn, lease.key, channel, fence=lease.fence)
            row = (
                await conn.execute(
                    select(sessions.c.title, sessions.c.metadata).where(sessions.c.id == session.id)
                )
            ).one()
            pending = (
                await conn.execute(
                    select(func.count())
                    .select_from(approvals)
                    .where(approvals.c.session_id == session.id, _PENDING)
                )
            ).scalar_one()
        return OpenSession(session, row.title, int(pending), dict(row.metadata or {}))

    async def close_session(self, lease: SessionLease, *, by: str, answer: Answer) -> SessionState | None:
        async with self.fenced(lease) as conn:
            current = await self.sessions.current(conn, lease.key)
            if current is not None:
                # A run waiting for approval cannot continue in a closed session.
                await cancel_pending(conn, current.id, by)
            closed = await self.sessions.close_current(conn, lease.key)
            await self._answered(conn, answer, closed.id if closed else None)
        return closed

    async def set_session_metadata(
        self,
        lease: SessionLease,
        channel: str,
        change: MetadataChange | None = None,
        *,
        title: str | None = None,
        answer: Answer | None = None,
    ) -> SessionState:
        async with self.fenced(lease) as conn:
            session = await self.sessions.open_current(conn, lease.key, channel, fence=lease.fence)
            values: dict[str, Any] = {"updated_at": utcnow()}
            state = session
            if title is not None:
                values["title"] = title
            if change is not None:
                # Read fresh: a tool (load_skill) may have written it during a turn.
                fresh = (
                    await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session.id))
                ).scalar() or {}
                metadata = change(dict(fresh)) if callable(change) else {**fresh, **change}
                values["metadata"] = metadata
                state = replace(session, metadata=metadata)
            await conn.execute(update(sessions).where(sessions.c.id == session.id).values(**values))
            self.sessions.remember(lease.key, state, fence=lease.fence)
            if answer is not None:
                await self._answered(conn, answer, session.id)
        return state

    async def generations(self, key: str, limit: int) -> list[dict[str, Any]]:
        columns = (
            sessions.c.id,
            sessions.c.generation,
            sessions.c.title,
            sessions.c.status,
            sessions.c.next_seq,
            sessions.c.metadata,
        )
        async with self.reader.connect() as conn:
            rows = await conn.execute(
                select(*columns)
                .where(sessions.c.key == key)
                .order_by(sessions.c.generation.desc())
                .limit(limit)
            )
            return [dict(r) for r in rows.mappings()]

    async def paused_run(self, lease: SessionLease, channel: str) -> tuple[SessionState, PausedRun | None]:
        async with self.fenced(lease) as conn:
            session = await self.sessions.open_current(conn, lease.key, channel, fence=lease.fence)
            waiting = (
                await conn.execute(
                    select(approvals.c.run_id).where(approvals.c.session_id == session.id, _PENDING)
                )
            ).first()
            if waiting is None:
                return session, None
            details = (
                await conn.execute(select(runs.c.details).where(runs.c.id == waiting.run_id))
            ).scalar_one_or_none()
        return session, PausedRun(session, int(waiting.run_id), dict(details or {}))

    async def stop_paused_run(
        self, lease: SessionLease, paused: PausedRun, *, by: str, final: ChatMessage, answer: Answer
    ) -> None:
        session = paused.session
        async with self.fenced(lease) as conn:
            closing = await close_open_group(conn, self.sessions, session, reason=f"stopped by {by}", by=by)
            await self.sessions.append(conn, session.id, [*closing, final], run_id=paused.run_id)
            await self._answered(conn, answer, session.id)

    async def decide_approval(
        self,
        lease: SessionLease,
        event: InboundEvent,
        command: str,
        channel: str,
        rules: ApprovalRules,
        answer: Callable[[NoDecision], Answer],
    ) -> Decided | NoDecision:
        async with self.fenced(lease) as conn:
            outcome = await decide(conn, self.sessions, rules, lease, event, command, channel)
            if isinstance(outcome, NoDecision):
                await self._answered(conn, answer(outcome), outcome.session_id)
        return outcome

    # --- the outbox -----------------------------------------------------------------------

    async def claim_outbox(self, claim: OutboxClaim) -> list[Any]:
        params = {"now": claim.now, "until": claim.until, "limit": claim.limit, "owner": claim.owner}
        async with direct.connect(self.reader) as conn:
            rows = await claim_statement(self.skip_locked, claim.channels).rows(conn, params)
        return sorted(rows, key=lambda r: r["id"])

    # --- outbound pacing --------------------------------------------------------------------

    async def take_pace(self, take: PaceTake) -> PaceGrant:
        async with self.engine.begin() as conn:
            return await pacing_queries.take(conn, take)

    async def pause_pace(self, names: Sequence[str], until: float) -> None:
        async with self.engine.begin() as conn:
            await pacing_queries.pause(conn, names, until)

    async def release_pace(self, names: Sequence[str], held_until: float) -> None:
        async with self.engine.begin() as conn:
            await pacing_queries.release(conn, names, held_until)

    async def pace_paused(self, names: Sequence[str]) -> float:
        async with self.reader.connect() as conn:
            return await pacing_queries.paused_until(conn, names)

    async def prune_pace(self, idle_before: float) -> int:
        async with self.engine.begin() as conn:
            return await pacing_queries.prune(conn, idle_before)
