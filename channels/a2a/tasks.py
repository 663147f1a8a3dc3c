"""A2A tasks, derived from the inbox: one task is one accepted message (its inbox event).

Nothing about a task is kept in memory. Its state is read from the event's inbox row
(pending → submitted, processing → working, failed → failed, done → completed, or
input-required while a tool call of its turn waits for `/approve`), its answer from the
event's outbox rows, and a cancel from the row itself (`canceled`: canceled before its
turn, it never runs) or from the `/stop` event stored for it (canceled while working). So a task
survives a restart and reads the same on every replica.
"""

from __future__ import annotations

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    Task,
    TaskState,
    TaskStatus,
)
from google.protobuf.struct_pb2 import Struct
from google.protobuf.timestamp_pb2 import Timestamp

from app.channel import EventStatus

TERMINAL = frozenset(
    {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED}
)
# States after which a task's stream ends: terminal, or waiting for the caller.
SETTLED = TERMINAL | {TaskState.TASK_STATE_INPUT_REQUIRED}

# The inbox status of an event canceled before its turn (`EventReader.cancel_pending`).
CANCELED = "canceled"
KIND_MESSAGE = "message"
KIND_CANCEL = "cancel"


def cancel_external_id(task_id: str) -> str:
    return f"cancel:{task_id}"


def task_state(event: EventStatus, *, canceled: bool) -> TaskState:
    if canceled or event.status == CANCELED:
        return TaskState.TASK_STATE_CANCELED
    if event.status == "pending":
        return TaskState.TASK_STATE_SUBMITTED
    if event.status == "processing":
        return TaskState.TASK_STATE_WORKING
    if event.status in ("failed", "discarded"):  # a dead letter; retried, it goes on
        return TaskState.TASK_STATE_FAILED
    if event.awaiting_approval:
        return TaskState.TASK_STATE_INPUT_REQUIRED
    return TaskState.TASK_STATE_COMPLETED


def build_task(event: EventStatus, *, canceled: bool, history_length: int | None = None) -> Task:
    meta = event.metadata.get("a2a", {})
    context_id = str(meta.get("context_id", ""))
    state = task_state(event, canceled=canceled)
    user = Message(
        message_id=str(meta.get("message_id", event.event_id)),
        context_id=context_id,
        task_id=event.event_id,
        role=Role.ROLE_USER,
        parts=[Part(text=event.text)],
    )
    answers = [r for r in event.replies if r.text]
    agent_messages = [
        Message(
            message_id=r.message_id,
            context_id=context_id,
            task_id=event.event_id,
            role=Role.ROLE_AGENT,
            parts=[Part(text=r.text)],
        )
        for r in answers
    ]
    status_message: Message | None = agent_messages[-1] if agent_messages else None
    if state == TaskState.TASK_STATE_FAILED and not agent_messages:
        status_message = Message(
            message_id=f"{event.event_id}:error",
            context_id=context_id,
            task_id=event.event_id,
            role=Role.ROLE_AGENT,
            parts=[Part(text=f"failed after {event.attempts} attempt(s): {event.error or 'unknown error'}")],
        )
    stamp = Timestamp()
    stamp.FromDatetime(event.updated_at)
    status = TaskStatus(state=state, timestamp=stamp)
    if status_message is not None and state in SETTLED:
        status.message.CopyFrom(status_message)
    history = [user, *agent_messages]
    if history_length is not None and history_length >= 0:
        history = history[-history_length:] if history_length else []
    metadata = Struct()
    metadata.update({"session_key": event.session_key, "attempts": event.attempts})
    return Task(
        id=event.event_id,
        context_id=context_id,
        status=status,
        artifacts=[
            Artifact(artifact_id=r.message_id, name="reply", parts=[Part(text=r.text)]) for r in answers
        ],
        history=history,
        metadata=metadata,
    )
