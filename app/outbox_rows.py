"""An outbox row for a message: what the pipeline's replies and the access notices store."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from app import tracing
from app.db.models import utcnow
from app.events import OutboundMessage, stored_json


def outbox_values(
    message: OutboundMessage,
    *,
    session_id: int | None,
    run_id: int | None,
    event_id: str | None,
    now: datetime | None = None,
    sent: bool = False,
) -> dict[str, Any]:
    """An outbox row; `sent`: its channel has nothing to send (`app.channel.delivers`)."""
    now = now or utcnow()
    return dict(
        message_id=message.message_id,
        session_key=message.session_key or "",
        session_id=session_id,
        run_id=run_id,
        event_id=event_id,
        channel=message.channel,
        chat_id=message.chat_id,
        payload=stored_json(message),
        status="sent" if sent else "pending",
        attempts=0,
        next_attempt_at=now,
        created_at=now,
        sent_at=now if sent else None,
        trace_context=tracing.carrier(),
    )
