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
from app.events import APPROVAL_KEY
from app.pipeline.approvals import call_name_and_arguments, question_text
from app.pipeline.feed import SessionFeed
from app.pipeline.replies import Replies, reply_for
from app.pipeline.run_trace import run_trace
from app.pipeline.storage.port import Answer, ApprovalRequest, PipelineStore
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
        request = ApprovalRequest(
            session_id=session.id,
            run_id=turn.run_id,
            call_id=call["id"],
            name=name,
            arguments=arguments,
            requested_at=now,
            expires_at=expires,
        )
        question = ""

        def answer(approval_id: int) -> Answer:
            nonlocal question  # it names the approval's id, known once the request is stored
            question = question_text(name, arguments, approval_id, self.timeout)
            prompt = reply_for(turn.reply_to, question)
            # Adapters with buttons add approve/deny buttons to the prompt (docs/events.md).
            prompt = prompt.model_copy(update={"metadata": {**prompt.metadata, APPROVAL_KEY: approval_id}})
            reply = self.replies.row(
                prompt,
                session_id=session.id,
                run_id=turn.run_id,
                event_id=turn.reply_to.event_id,
            )
            return Answer([r.id for r in turn.rows], [reply], link=turn.run_id if turn.link_rows else None)

        approval_id = await self.store.pause_for_approval(lease, request, answer, trace)
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
