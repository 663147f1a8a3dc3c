"""DINGTALK_STREAMING=native: the answer streams into an AI card (the SDK's AICardReplier calls)."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.discord.test_discord_streaming import ANSWER
from tests.channels.support import llm_settings, stored_answer, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk
from tests.fakes.openai_server import FakeOpenAI, Reply

TEMPLATE = "tpl-ai-card.schema"


async def test_streamed_turn_is_one_card_updated_in_place_and_finalized(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.03)) as llm, FakeDingTalk() as fake:
        settings = dingtalk_settings(
            fake, streaming="native", card_template_id=TEMPLATE, stream_edit_seconds=0.5
        )
        async with (
            serve(
                channel_settings={"dingtalk": settings}, stream_first_preview_seconds=0.3, **llm_settings(llm)
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            message = dt.robot_message("tell me a story", group=True, webhook=fake.webhook_url)
            await post_message(client, srv.url, message)
            [row] = await wait_outbox_final(srv.runtime)
            stored = await stored_answer(srv.runtime)
    [(track_id, card)] = fake.cards.items()
    updates = [c for c in fake.calls_of(dt.CARD_STREAMING) if c.ok]
    assert row["status"] == "sent" and stored == ANSWER
    assert not fake.delivered(), "the answer is the card, not a message"
    assert card.template == TEMPLATE and card.space == "dtv1.card//IM_GROUP.cidGROUP001=="
    assert card.params["content"] == stored and card.params["flowStatus"] == "3" and card.finalized
    assert 1 <= len(updates) <= 8
    assert updates[-1].body["isFinalize"] and not any(u.body["isFinalize"] for u in updates[:-1])
    assert row["platform_message_id"] == track_id


async def test_throttled_card_update_slows_the_stream_and_the_answer_still_arrives(serve: ServeApp) -> None:
    async with FakeOpenAI(default=Reply(content=ANSWER, chunk_delay=0.02)) as llm, FakeDingTalk() as fake:
        fake.fail(dt.CARD_STREAMING, dt.THROTTLED)
        settings = dingtalk_settings(
            fake, streaming="native", card_template_id=TEMPLATE, stream_edit_seconds=0.2
        )
        async with (
            serve(
                channel_settings={"dingtalk": settings},
                stream_first_preview_seconds=0.2,
                outbox_backoff_base_seconds=0.05,
                **llm_settings(llm),
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_message(client, srv.url, dt.robot_message("go", webhook=fake.webhook_url))
            [row] = await wait_outbox_final(srv.runtime, timeout=30)
            stored = await stored_answer(srv.runtime)
    [card] = fake.cards.values()
    assert row["status"] == "sent"
    assert card.space == "dtv1.card//IM_ROBOT.staff-alice"
    assert card.params["content"] == stored and card.finalized
    assert not fake.delivered()
    assert not fake.calls_of(dt.CARD_STREAMING)[0].ok


def test_native_streaming_needs_a_card_template_and_edit_is_refused() -> None:
    with pytest.raises(ValidationError, match="DINGTALK_CARD_TEMPLATE_ID"):
        dingtalk_settings(FakeDingTalk(), streaming="native")
    with pytest.raises(ValidationError, match="not implemented"):
        dingtalk_settings(FakeDingTalk(), streaming="edit")
