"""SIGKILL in the middle of a streamed reply: after the restart, the chat shows one message, completed once.

A real `python -m app serve` process talks to the fake Bot API and a fake model that writes
slowly; it is killed after its preview has been edited, and a new process finishes the turn
(`tests.channels.crash`).
"""

from __future__ import annotations

import httpx
import pytest

from tests.channels.crash import ANSWER, kill_mid_stream, server_env, slow_model
from tests.channels.telegram.support import SECRET, post_update
from tests.fakes import telegram as tg
from tests.fakes.telegram import FakeTelegram

# serial: SIGKILL mid-stream and restart: start-up under load outruns the ready timeout.
pytestmark = [pytest.mark.slow, pytest.mark.serial]


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    async with slow_model() as llm, FakeTelegram() as fake:
        env = server_env(
            db_url,
            llm,
            {
                "CHANNELS": "telegram",
                "TELEGRAM_BOT_TOKEN": fake.token,
                "TELEGRAM_WEBHOOK_SECRET": SECRET,
                "TELEGRAM_API_BASE_URL": fake.url,
                "TELEGRAM_FILE_BASE_URL": fake.file_url,
                "TELEGRAM_STREAM_EDIT_SECONDS": "0.3",
            },
        )
        shown_at_kill: dict[int, str] = {}

        async def send(url: str) -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_update(client, url, tg.update(900, tg.message("a long story please")))
                assert resp.status_code == 200

        async def streaming() -> None:
            await fake.wait_for("editMessageText", 1, timeout=30)
            shown_at_kill.update(fake.texts)

        outcome = await kill_mid_stream(env, send=send, streaming=streaming)
    [(preview_id, half)] = shown_at_kill.items()
    assert half != ANSWER
    assert outcome.statuses == ["sent"]
    assert outcome.answers == [ANSWER]
    assert len([c for c in fake.calls_of("sendMessage") if c.ok]) == 1, "answered twice"
    assert fake.texts == {preview_id: ANSWER}, "the preview was left half"
