"""SIGKILL in the middle of a streamed Discord reply: after the restart, one message, completed once.

A real `python -m app serve` process gets a message over the fake Gateway, streams its
answer into the fake REST API (edit mode: a preview posted, then PATCHed) and is killed
after the preview was edited. A new process re-runs the turn: it finds the stored preview,
goes on editing it, and the answer is its last edit — never a second answer.
"""

from __future__ import annotations

import pytest

from tests.channels.crash import ANSWER, kill_mid_stream, server_env, slow_model
from tests.fakes import discord as dc
from tests.fakes.discord import FakeDiscord

pytestmark = pytest.mark.slow

CHANNEL_ID = "2190"


def _posts(fake: FakeDiscord) -> list[dc.Call]:
    path = f"/channels/{CHANNEL_ID}/messages"
    return [c for c in fake.calls if c.ok and c.method == "POST" and c.path == path]


def _edits(fake: FakeDiscord) -> list[dc.Call]:
    prefix = f"/channels/{CHANNEL_ID}/messages/"
    return [c for c in fake.calls if c.ok and c.method == "PATCH" and c.path.startswith(prefix)]


async def test_sigkill_mid_stream_leaves_one_completed_message(db_url: str) -> None:
    async with slow_model() as llm, FakeDiscord() as fake:
        env = server_env(
            db_url,
            llm,
            {
                "CHANNELS": "discord",
                "DISCORD_BOT_TOKEN": dc.TOKEN,
                "DISCORD_API_BASE": fake.url,
                "DISCORD_GATEWAY_URL": fake.gateway_url,
                "DISCORD_STREAM_EDIT_SECONDS": "0.3",
                "CONNECTION_LEASE_TTL_SECONDS": "2",
            },
        )
        shown_at_kill: dict[str, str] = {}
        edits_at_kill: list[int] = []

        async def send(_url: str) -> None:
            await fake.wait_ready(timeout=30)
            await fake.dispatch("MESSAGE_CREATE", dc.message("a long story please", channel_id=CHANNEL_ID))

        async def streaming() -> None:
            await fake.wait_until(lambda: bool(_edits(fake)), timeout=30)
            shown_at_kill.update(fake.texts)
            edits_at_kill.append(len(_edits(fake)))

        outcome = await kill_mid_stream(env, send=send, streaming=streaming)
    [(preview_id, half)] = shown_at_kill.items()
    assert half != ANSWER
    assert outcome.statuses == ["sent"]
    assert outcome.answers == [ANSWER]
    [preview] = _posts(fake)
    assert len(_posts(fake)) == 1, "answered twice"
    assert preview.body["content"] != ANSWER
    assert fake.texts == {preview_id: ANSWER}, "the preview was left half"
    assert len(_edits(fake)) > edits_at_kill[0]  # the restarted process completed it
    assert _edits(fake)[-1].body["content"] == ANSWER
