"""SIGKILL in the middle of a Slack stream (SLACK_STREAMING=native): after the restart, one message.

The killed process started a stream and appended to it; the new process does not know
what the stream shows, so it appends nothing and the answer stops the stream and sets the
message's text (`chat.update`): one message, the stored answer, never a second post.
"""

from __future__ import annotations

import httpx
import pytest

from tests.channels.crash import ANSWER, kill_mid_stream, server_env, slow_model
from tests.channels.slack.support import post_event
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack

pytestmark = pytest.mark.slow


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    async with slow_model() as llm, FakeSlack() as fake:
        env = server_env(
            db_url,
            llm,
            {
                "CHANNELS": "slack",
                "SLACK_BOT_TOKEN": fake.token,
                "SLACK_SIGNING_SECRET": sl.SIGNING_SECRET,
                "SLACK_API_BASE_URL": fake.url,
                "SLACK_BOT_USER_ID": sl.BOT_USER_ID,
                "SLACK_STREAMING": "native",
                "SLACK_STREAM_EDIT_SECONDS": "0.3",
            },
        )
        shown_at_kill: dict[str, str] = {}

        async def send(url: str) -> None:
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_event(client, url, sl.event_callback(sl.dm("a long story please")))
                assert resp.status_code == 200

        async def streaming() -> None:
            await fake.wait_for("chat.appendStream", 1, timeout=30)
            shown_at_kill.update(fake.texts)
            assert set(shown_at_kill) <= set(fake.streaming)

        outcome = await kill_mid_stream(env, send=send, streaming=streaming)
    [(ts, half)] = shown_at_kill.items()
    assert half != ANSWER
    assert outcome.statuses == ["sent"]
    assert outcome.answers == [ANSWER]
    assert len(fake.calls_of("chat.startStream")) == 1 and fake.posted() == [], "answered twice"
    assert fake.texts == {ts: ANSWER}, "the stream was left half"
    assert not fake.streaming, "the stream was stopped"
    assert [c.params["text"] for c in fake.calls_of("chat.update") if c.ok] == [ANSWER]
