"""Approvals of risky tool calls: who may decide, the stored request, the decision.

A paused run is not a task in memory: its state is the history (the assistant's tool
calls without all results), the `approvals` row and the `runs` row, so a pending
approval survives a restart of every replica. The turn handler stores a request
(`insert_request`) when the gate says "ask"; a `/approve <id>` or `/deny <id>` event, or
the timeout's `/deny`, is checked by `decide`, and the turn handler continues the run
with the decision. Everything here runs inside the caller's fenced transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import Row, RowMapping, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from app.agent.loop import Decision, open_calls
from app.channel import ChannelSettings
from app.db.models import approvals, inbox, runs, utcnow
from app.events import ChatType, InboundEvent, TextPart
from app.sessions.lease import SessionLease
from app.sessions.profiles import SessionProfiles
from app.sessions.store import SessionState, SessionStore

log = structlog.get_logger(__name__)

APPROVAL_TIMEOUT_SENDER = "chatgate:approval-timeout"


class ApprovalRules:
    """Who may approve a risky call: each channel's approvers, and the serving agent's."""

    def __init__(self, channel_settings: Mapping[str, ChannelSettings], profiles: SessionProfiles) -> None:
        self.channel_settings = channel_settings
        self.profiles = profiles  # the approvers the agent of a session key declares (app.agents)

    def possible(self, origin: InboundEvent, key: str = "") -> bool:
        """Can anyone approve calls of a run that serves `origin` (in session `key`)?"""
        if self.profiles.approvers_of(key):
            return True
        settings = self.channel_settings.get(origin.channel)
        if settings is None:
            return False
        if getattr(settings, "approvers_ask_only_for_themselves", False):
            # API callers (the OpenAI-compatible API): a request waits for an approval
            # only when its own caller may give it; anyone else's is refused at once.
            return origin.sender_id in settings.approvers
        if settings.approvers:
            return True
        return settings.approve_own_requests_in_direct and origin.chat_type is ChatType.DIRECT

    def may_decide(
        self, origin: InboundEvent, requester: str | None, event: InboundEvent, key: str = ""
    ) -> bool:
        if event.sender_id in self.profiles.approvers_of(key):
            return True
        settings = self.channel_settings.get(event.channel)
        if settings is None:
            return False
        if event.sender_id in settings.approvers:
            return True
        return (
            settings.approve_own_requests_in_direct
            and origin.chat_type is ChatType.DIRECT
            and event.chat_type is ChatType.DIRECT
            and event.sender_id == requester
        )

    def gate(self, origin: InboundEvent, key: str = "") -> Decision:
        if self.possible(origin, key):
            return Decision("ask")
        # Webhook and cron sessions have no human who could answer: deny, don't hang.
        return Decision("deny", by="policy", reason=self._no_approver_reason(origin.channel))

    def _no_approver_reason(self, channel: str) -> str:
        """Why nothing can be approved here, naming the setting that changes it."""
        settings = self.channel_settings.get(channel)
        prefix = str(settings.model_config.get("env_prefix", "")) if settings is not None else ""
        fix = f"{prefix}APPROVERS" if prefix else "the channel's APPROVERS setting"
        return (
            "no one may approve this tool in this conversation "
            f"(the operator can name approvers' sender ids in {fix}, or an agent's approvers)"
        )


@dataclass(frozen=True)
class Decided:
    """A stored decision whose run continues now."""

    approval: RowMapping
    run: RowMapping
    session: SessionState
    origin: InboundEvent  # whose request the run serves
    decision: Decision
    status: str  # approved | denied | expired


@dataclass(frozen=True)
class NoDecision:
    """Nothing continues: answer `reply` in the session `session_id` (None: answer nothing)."""

    reply: str | None
    session_id: int | None = None
    refused: bool = False  # the sender may not decide: the reply is a private notice to them


def call_name_and_arguments(call: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    function = call.get("function", {})
    raw = function.get("arguments") or "{}"
    try:
        arguments = json.loads(raw)
    except ValueError:
        arguments = {"raw": raw}
    return function.get("name", ""), arguments


async def insert_request(
    conn: AsyncConnection,
    *,
    session_id: int,
    key: str,
    run_id: int,
    call_id: str,
    name: str,
    arguments: Mapping[str, Any],
    requested_at: datetime,
    expires_at: datetime,
) -> int:
    """Store a pending approval of a tool call; returns its id (what `/approve <id>` names)."""
    statement = (
        approvals.insert()
        .values(
            session_id=session_id,
            session_key=key,
            run_id=run_id,
            tool_call_id=call_id,
            tool_name=name,
            arguments=arguments,
            status="pending",
            requested_at=requested_at,
            expires_at=expires_at,
        )
        .returning(approvals.c.id)
    )
    return int((await conn.execute(statement)).scalar_one())


def question_text(name: str, arguments: Mapping[str, Any], approval_id: int, timeout: float) -> str:
    shown = json.dumps(arguments, ensure_ascii=False)
    if len(shown) > 300:
        shown = shown[:300] + "…"
    return (
        f"Tool {name} wants to run with {shown}; reply /approve {approval_id} or "
        f"/deny {approval_id} (denied automatically in {round(timeout)} s)."
    )


async def decide(
    conn: AsyncConnection,
    store: SessionStore,
    rules: ApprovalRules,
    lease: SessionLease,
    event: InboundEvent,
    command: str,
    session_channel: str,
) -> Decided | NoDecision:
    """Check the `/approve` or `/deny` in `event` and store the decision."""
    words = event.text.split()
    approval_id = int(words[1]) if len(words) > 1 and words[1].isdigit() else None
    timeout = bool(event.metadata.get("approval_timeout")) and event.sender_id == APPROVAL_TIMEOUT_SENDER
    approval = None
    if approval_id is not None:
        found = await conn.execute(
            select(approvals).where(approvals.c.id == approval_id, approvals.c.session_key == lease.key)
        )
        approval = found.mappings().first()
    if approval is not None and approval["status"] != "pending":
        resumed = await _decided_but_unfinished(conn, store, lease, event, approval, session_channel)
        if resumed is not None:
            return resumed
    if approval is None or approval["status"] != "pending":
        if timeout:  # the run went on without it
            return NoDecision(None)
        if len(words) > 1:
            return NoDecision(f"There is no pending approval {words[1]} here.")
        return NoDecision(f"Usage: {command} <id>")
    run = (await conn.execute(select(runs).where(runs.c.id == approval["run_id"]))).mappings().one()
    details = dict(run["details"] or {})
    origin = await _origin(conn, run, event)
    if timeout:
        status, by = "expired", "timeout"
    elif rules.may_decide(origin, details.get("requester"), event, lease.key):
        status, by = ("approved" if command == "/approve" else "denied"), event.sender_id
    else:
        refusals = [*details.get("approval_refusals", []), {"sender": event.sender_id, "command": command}]
        await conn.execute(
            update(runs)
            .where(runs.c.id == run["id"])
            .values(details={**details, "approval_refusals": refusals})
        )
        log.warning("approval_refused", approval_id=approval_id, sender=event.sender_id)
        return NoDecision(
            "You are not allowed to decide this approval.", approval["session_id"], refused=True
        )
    session = await store.open_current(conn, lease.key, session_channel, fence=lease.fence)
    open_ids = [c["id"] for c in open_calls(await store.tail(session.id, 64, conn=conn))]
    if session.id != approval["session_id"] or approval["tool_call_id"] not in open_ids:
        await _set_status(conn, approval["id"], "cancelled", "stale")
        return NoDecision("That request is no longer pending.", session.id)
    await _set_status(conn, approval["id"], status, by)
    return Decided(approval, run, session, origin, _decision(status, by), status)


async def _decided_but_unfinished(
    conn: AsyncConnection,
    store: SessionStore,
    lease: SessionLease,
    event: InboundEvent,
    approval: RowMapping,
    session_channel: str,
) -> Decided | None:
    """A decision that was stored, but whose run a crash cut before it finished.

    Retrying the decision event (or any later one for this approval) continues the run
    with the stored decision instead of answering "no pending approval".
    """
    if approval["status"] not in ("approved", "denied", "expired"):
        return None
    run = (await conn.execute(select(runs).where(runs.c.id == approval["run_id"]))).mappings().first()
    if run is None or run["outcome"] != "awaiting_approval":
        return None
    waiting = (
        await conn.execute(
            select(approvals.c.id).where(approvals.c.run_id == run["id"], approvals.c.status == "pending")
        )
    ).first()
    session = await store.open_current(conn, lease.key, session_channel, fence=lease.fence)
    if waiting is not None or session.id != approval["session_id"]:
        return None
    origin = await _origin(conn, run, event)
    status = approval["status"]
    return Decided(approval, run, session, origin, _decision(status, approval["decided_by"]), status)


def _decision(status: str, by: str | None) -> Decision:
    """What the run gets for a stored decision (approved, denied or expired)."""
    if status == "expired":
        return Decision("deny", by=by, reason="no decision before the timeout")
    return Decision("allow" if status == "approved" else "deny", by=by, reason=f"denied by {by}")


async def _origin(conn: AsyncConnection, run: RowMapping, event: InboundEvent) -> InboundEvent:
    """The event whose request the run serves (the decision event if it is gone)."""
    details = run["details"] or {}
    return await event_by_id(conn, details.get("origin_event_id")) or event


async def _set_status(conn: AsyncConnection, approval_id: int, status: str, by: str | None) -> None:
    await conn.execute(
        update(approvals)
        .where(approvals.c.id == approval_id)
        .values(status=status, decided_by=by, decided_at=utcnow())
    )


async def cancel_pending(conn: AsyncConnection, session_id: int, by: str) -> Sequence[Row[Any]]:
    """Cancel the session's pending approvals; returns their tool call ids, runs and tools."""
    cancelled = await conn.execute(
        update(approvals)
        .where(approvals.c.session_id == session_id, approvals.c.status == "pending")
        .values(status="cancelled", decided_by=by, decided_at=utcnow())
        .returning(approvals.c.tool_call_id, approvals.c.run_id, approvals.c.tool_name)
    )
    return cancelled.all()


async def event_by_id(conn: AsyncConnection, event_id: str | None) -> InboundEvent | None:
    if not event_id:
        return None
    payload = (await conn.execute(select(inbox.c.payload).where(inbox.c.event_id == event_id))).scalar()
    return InboundEvent.model_validate(payload) if payload else None


async def timeout_events(conn: AsyncConnection, now: datetime) -> list[InboundEvent]:
    """A `/deny` event for each pending approval past its deadline, to queue on its session.

    The event's external id is the approval's, so replicas that find the same expired
    approval queue it once.
    """
    expired = (
        (
            await conn.execute(
                select(approvals.c.id, approvals.c.session_key, runs.c.details)
                .select_from(approvals.join(runs, runs.c.id == approvals.c.run_id))
                .where(approvals.c.status == "pending", approvals.c.expires_at < now)
                .limit(100)
            )
        )
        .mappings()
        .all()
    )
    events = []
    for row in expired:
        origin = await event_by_id(conn, (row["details"] or {}).get("origin_event_id"))
        if origin is None:
            continue
        events.append(
            InboundEvent(
                channel=origin.channel,
                chat_id=origin.chat_id,
                sender_id=APPROVAL_TIMEOUT_SENDER,
                thread_id=origin.thread_id,
                chat_type=origin.chat_type,
                parts=(TextPart(text=f"/deny {row['id']}"),),
                external_id=f"approval-timeout:{row['id']}",
                session_key_override=row["session_key"],
                metadata={
                    "approval_timeout": True,
                    **{k: v for k, v in origin.metadata.items() if k.startswith("reply_")},
                },
            )
        )
    return events
