"""`shielded`: work left going by a cancelled caller still has its failure seen."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from structlog.testing import capture_logs

from app.db.outage import shielded


async def test_a_shielded_read_failing_after_its_caller_left_is_one_log_line_not_an_unseen_task() -> None:
    unseen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unseen.append(context))
    try:
        release, failed = asyncio.Event(), asyncio.Event()

        async def read() -> int:
            try:
                await release.wait()
                raise ConnectionResetError("connection was closed in the middle of operation")
            finally:
                failed.set()

        async def caller() -> int:
            return await shielded(read())

        with capture_logs() as logs:
            task = asyncio.create_task(caller())
            await asyncio.sleep(0)  # the read is under way
            task.cancel()  # the model answered: the stop watcher is cancelled mid-read
            await asyncio.gather(task, return_exceptions=True)
            release.set()  # and then the database goes away
            await failed.wait()
            await asyncio.sleep(0)  # the read's done callbacks
            gc.collect()  # an unretrieved task's exception is reported when it is collected
        assert task.cancelled()
        assert [(e["event"], e["log_level"], e.get("work")) for e in logs] == [
            (
                "shielded_work_failed",
                "warning",
                "test_a_shielded_read_failing_after_its_caller_left_is_one_log_line_not_an_unseen_task.<locals>.read",
            )
        ]
        assert unseen == []
    finally:
        loop.set_exception_handler(None)


async def test_a_caller_still_there_gets_the_failure_itself() -> None:
    async def read() -> int:
        raise ConnectionResetError("reset")

    with capture_logs() as logs:
        try:
            await shielded(read())
        except ConnectionResetError:
            pass
        else:
            raise AssertionError("the failure did not reach the caller")
    assert logs == []
