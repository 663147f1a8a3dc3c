"""SIGKILL in the middle of a reply streamed into a DingTalk AI card: after the restart, one
card, finalized once with the stored answer, and no second message."""

from __future__ import annotations

import httpx
import pytest

from tests.channels.crash import ANSWER, kill_mid_stream, server_env, slow_model
from tests.channels.dingtalk.support import post_message
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk

pytestmark = pytest.mark.slow


async def test_sigkill_mid_stream_leaves_one_finalized_card(db_url: str) -> None:
    async with slow_model() as llm, FakeDingTalk() as fake:
        env = server_env(
            db_url,
            llm,
            {
                "CHANNELS": "dingtalk",
                "DINGTALK_CLIENT_ID": fake.client_id,
                "DINGTALK_CLIENT_SECRET": fake.client_secret,
                "DINGTALK_API_BASE": fake.url,
                "DINGTALK_MODE": "http",
                "DINGTALK_STREAMING": "native",
                "DINGTALK_CARD_TEMPLATE_ID": "tpl-ai-card.schema",
                "DINGTALK_STREAM_EDIT_SECONDS": "0.3",
                "PACING_ENABLED": "true",
                # Pacing is on: the card's updates take the `dingtalk.card` bucket (20 a
                # second), not the chat's 20 messages a minute (docs/operations.md).
            },
        )
        shown_at_kill: list[str] = []

        async def send(url: str) -> None:
            message = dt.robot_message("a long story please", group=True, webhook=fake.webhook_url)
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_message(client, url, message)
                assert resp.status_code == 200, resp.text

        async def streaming() -> None:
            # Two updates within 10 s: paced as chat messages (one preview in 6 s after
            # the card itself) the second would come after about 13 s.
            await fake.wait_for(lambda: len(fake.calls_of(dt.CARD_STREAMING)) >= 2, timeout=10)
            shown_at_kill.extend(str(c.params.get("content")) for c in fake.cards.values())

        outcome = await kill_mid_stream(env, send=send, streaming=streaming)
    [half] = shown_at_kill
    [card] = fake.cards.values()
    finals = [c for c in fake.calls_of(dt.CARD_STREAMING) if c.body["isFinalize"]]
    assert half != ANSWER
    assert outcome.statuses == ["sent"] and outcome.answers == [ANSWER]
    assert len(fake.calls_of(dt.CARD_CREATE)) == 1, "a second card"
    assert not fake.delivered(), "the answer came as a message besides the card"
    assert card.params["content"] == ANSWER and card.finalized and card.params["flowStatus"] == "3"
    assert len(finals) == 1
