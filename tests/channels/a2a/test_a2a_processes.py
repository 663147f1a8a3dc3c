"""An A2A task survives SIGKILL of the server that accepted it (real server processes)."""

from __future__ import annotations

import httpx
import pytest
from a2a.types.a2a_pb2 import CancelTaskRequest, GetTaskRequest, TaskState
from a2a.utils.errors import TaskNotFoundError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import create_async_engine

from app.db.models import messages, outbox, sessions
from tests.channels.a2a.test_a2a import TOKEN_A, TOKEN_B, only_task, sdk_client, user_message, wait_state
from tests.support.servers import ServerProcess, start_together, stop_all
from tests.support.timing import scaled

# serial: SIGKILL and restart of server processes: start-up under load outruns the ready timeout.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


def _env(db_url: str) -> dict[str, str]:
    return {
        "DATABASE_URL": db_url,
        "CHANNELS": "a2a",
        "A2A_TOKENS": f"{TOKEN_A}=agent-one,{TOKEN_B}=agent-two",
        "OFFLINE_LATENCY_MS": "1500",
        "LEASE_TTL_SECONDS": str(scaled(2)),  # renewed in time by a starved server too
        "INBOX_POLL_SECONDS": "0.2",
        "OUTBOX_POLL_SECONDS": "0.1",
        "LOG_LEVEL": "WARNING",
    }


async def test_task_survives_sigkill_of_the_server(db_url: str) -> None:
    env = _env(db_url)
    server = ServerProcess(env).start()
    try:
        async with sdk_client(server.url, TOKEN_A) as client:
            task = await only_task(client, user_message("survive this", "crash"), immediately=True)
            await wait_state(client, task.id, {TaskState.TASK_STATE_WORKING})
        server.kill()  # mid-turn: the model call is still sleeping
    finally:
        await stop_all(server)

    restarted = ServerProcess(env).start()
    engine = create_async_engine(db_url)
    try:
        async with sdk_client(restarted.url, TOKEN_A) as client:
            done = await wait_state(client, task.id, {TaskState.TASK_STATE_COMPLETED}, timeout=60)
            assert [p.text for a in done.artifacts for p in a.parts] == ["You said: survive this"]
            assert done.context_id == "crash"
        async with sdk_client(restarted.url, TOKEN_B) as other, httpx.AsyncClient(timeout=30) as http:
            card = await http.get(f"{restarted.url}/.well-known/agent-card.json")
            assert card.status_code == 200
            with pytest.raises(TaskNotFoundError):
                await other.get_task(GetTaskRequest(id=task.id))
        async with engine.connect() as conn:
            replies = (
                await conn.execute(select(outbox.c.event_id).where(outbox.c.event_id == task.id))
            ).all()
            answers = (
                await conn.execute(
                    select(messages.c.content)
                    .join(sessions, sessions.c.id == messages.c.session_id)
                    .where(sessions.c.key == "a2a:agent-one:crash", messages.c.role == "assistant")
                )
            ).all()
        assert len(replies) == 1  # answered exactly once
        assert [a[0] for a in answers] == ["You said: survive this"]
    finally:
        await stop_all(restarted)
        await engine.dispose()


async def test_a_task_accepted_by_one_replica_is_read_and_canceled_on_another(pg_url: str) -> None:
    # CHANNELS without a2a: configured callers (A2A_TOKENS) are enough to serve it.
    env = {**_env(pg_url), "CHANNELS": "webhook", "OFFLINE_LATENCY_MS": "3000", "STOP_POLL_SECONDS": "0.1"}
    first, second = (await start_together({"first": env, "second": env})).values()
    try:
        async with sdk_client(first.url, TOKEN_A) as one, sdk_client(second.url, TOKEN_A) as two:
            task = await only_task(one, user_message("slow one", "across"), immediately=True)
            seen = await wait_state(two, task.id, {TaskState.TASK_STATE_WORKING})
            assert seen.context_id == "across"
            canceled = await two.cancel_task(CancelTaskRequest(id=task.id))
            assert canceled.status.state == TaskState.TASK_STATE_CANCELED
            assert (
                await one.get_task(GetTaskRequest(id=task.id))
            ).status.state == TaskState.TASK_STATE_CANCELED
            done = await only_task(two, user_message("quick now", "across"))  # same context, next turn
            assert done.status.state == TaskState.TASK_STATE_COMPLETED
            assert [p.text for a in done.artifacts for p in a.parts] == ["You said: quick now"]
    finally:
        await stop_all(first, second)
