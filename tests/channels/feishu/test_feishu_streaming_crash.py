"""SIGKILL in the middle of a streamed reply on Feishu: after the restart, one message, completed once.

Both streaming modes: a text preview edited in place (`edit`) and a streaming card
(`native`, whose update sequence numbers must keep growing across the two processes).
"""

from __future__ import annotations

import httpx
import pytest

from tests.channels.crash import ANSWER, kill_mid_stream, server_env, slow_model
from tests.channels.feishu.support import post_callback
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu

pytestmark = pytest.mark.slow


def _env(db_url: str, llm_url: str, fake: FakeFeishu, streaming: str) -> dict[str, str]:
    return {
        "CHANNELS": "feishu",
        "FEISHU_APP_ID": fs.APP_ID,
        "FEISHU_APP_SECRET": fs.APP_SECRET,
        "FEISHU_VERIFICATION_TOKEN": fs.VERIFICATION_TOKEN,
        "FEISHU_ENCRYPT_KEY": fs.ENCRYPT_KEY,
        "FEISHU_API_BASE": fake.url,
        "FEISHU_BOT_OPEN_ID": fs.BOT_OPEN_ID,
        "FEISHU_STREAMING": streaming,
        "FEISHU_STREAM_EDIT_SECONDS": "0.3",
    }


async def _send(url: str) -> None:
    async with httpx.AsyncClient(timeout=30) as client:
        resp = await post_callback(client, url, fs.text_event("a long story please", chat_id="oc_crash"))
        assert resp.status_code == 200, resp.text


async def test_sigkill_mid_stream_leaves_one_completed_card(db_url: str) -> None:
    async with slow_model() as llm, FakeFeishu() as fake:
        env = server_env(db_url, llm, _env(db_url, llm.url, fake, "native"))
        shown_at_kill: list[str] = []

        async def streaming() -> None:
            await fake.wait_for(2, "card_content", timeout=30)
            shown_at_kill.extend(c.text for c in fake.cards.values())

        outcome = await kill_mid_stream(env, send=_send, streaming=streaming)
    [half] = shown_at_kill
    [card] = fake.cards.values()
    [sent] = fake.delivered()
    assert half != ANSWER
    assert outcome.statuses == ["sent"] and outcome.answers == [ANSWER]
    assert sent.body["msg_type"] == "interactive" and len(card.messages) == 1, "answered twice"
    assert card.text == ANSWER and not card.streaming, "the card was left half"
    assert not [c for c in fake.calls_of("card_content", "card_settings") if not c.ok]
    assert fake.texts == {}


async def test_sigkill_mid_stream_leaves_one_completed_text_message(db_url: str) -> None:
    async with slow_model() as llm, FakeFeishu() as fake:
        env = server_env(db_url, llm, _env(db_url, llm.url, fake, "edit"))
        shown_at_kill: dict[str, str] = {}

        async def streaming() -> None:
            await fake.wait_for(1, "update", timeout=30)
            shown_at_kill.update(fake.texts)

        outcome = await kill_mid_stream(env, send=_send, streaming=streaming)
    [(preview_id, half)] = shown_at_kill.items()
    assert half != ANSWER
    assert outcome.statuses == ["sent"] and outcome.answers == [ANSWER]
    assert len(fake.delivered()) == 1, "answered twice"
    assert fake.texts == {preview_id: ANSWER}, "the preview was left half"
