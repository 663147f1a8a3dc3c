"""A run that asks for approval of a risky tool call pauses: the approval request is
stored, the question is the turn's answer (its outbox row), the inbox rows are done and
the run's trace is saved, in one fenced transaction; watchers learn of the request.
`/approve` or `/deny` continues the run later (`TurnRunner.resume`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import structlog

from app.agent.loop import RunRecord
from app.db.models import utcnow
from app.pipeline.approvals import call_name_and_arguments, insert_request, question_text
from app.pipeline.feed import SessionFeed
from app.pipeline.replies import Replies, reply_for
from app.pipeline.run_trace import UPDATE_RUN, run_trace
from app.pipeline.storage.inbox_queries import MARK
from app.pipeline.storage.port import PipelineStore
from app.pipeline.turn_state import TurnState

log = structlog.get_logger(__name__)


class Pause:
    def __init__(self, store: PipelineStore, replies: Replies, feed: SessionFeed, timeout: float) -> None:
        self.store = store
        self.replies = replies
        self.feed = feed
        self.timeout = timeout

    async def __call__(
        self,
        turn: TurnState,
        call: dict[str, Any],
        record: RunRecord,
        *,
        saved: Callable[[dict[str, Any]], None],
    ) -> None:
        lease, session = turn.lease, turn.session
        name, arguments = call_name_and_arguments(call)
        now = utcnow()
        expires = now + timedelta(seconds=self.timeout)
        record.outcome = "awaiting_approval"
        assert turn.run_row is not None  # read by the caller
        trace = run_trace(turn.run_row, record, [r.event_id for r in turn.rows], finished=False, now=now)
        async with self.store.fenced(lease) as conn:
            approval_id = await insert_request(
                conn,
                session_id=session.id,
                key=lease.key,
                run_id=turn.run_id,
                call_id=call["id"],
                name=name,
                arguments=arguments,
                requested_at=now,
                expires_at=expires,
            )
            question = question_text(name, arguments, approval_id, self.timeout)
            await self.replies.insert(
                conn,
                reply_for(turn.reply_to, question),
                session_id=session.id,
                run_id=turn.run_id,
                event_id=turn.reply_to.event_id,
            )
            done = {"ids": [r.id for r in turn.rows], "status": "done", "updated_at": now}
            if turn.link_rows:
                done["run_id"] = turn.run_id
            await conn.execute(MARK, done)
            await conn.execute(UPDATE_RUN, {**trace, "run_id_": turn.run_id})
        saved(trace)
        self.replies.handled([r.event_id for r in turn.rows])
        log.info("approval_requested", approval_id=approval_id, tool=name)
        await self.feed.event(
            lease.key,
            "approval_request",
            run_id=turn.run_id,
            approval_id=approval_id,
            tool=name,
            arguments=arguments,
            tool_call_id=call["id"],
            expires_at=expires.isoformat(),
            text=question,
        )
