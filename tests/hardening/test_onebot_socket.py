"""The OneBot reverse WebSocket keeps the bridge through hostile frames (issue 16, item 5):
a 10,000-deep frame or an unstorable message loses only itself; the next event is answered."""

from __future__ import annotations

import json

from app.db.models import inbox
from channels.onebot import OneBotSettings
from tests.channels.support import count
from tests.conftest import ServeApp
from tests.fakes.onebot import FakeBridge, private_message

TOKEN = "onebot-test-token"
BOT = 10001


async def test_deep_and_unstorable_frames_keep_the_bridge_and_the_next_event_is_answered(
    serve: ServeApp,
) -> None:
    settings = OneBotSettings(_env_file=None, access_token=TOKEN, api_timeout_seconds=2.0)  # type: ignore[call-arg]
    async with serve(channel_settings={"onebot": settings}) as srv:
        url = srv.url.replace("http://", "ws://") + "/channels/onebot/ws"
        async with FakeBridge(url, BOT, TOKEN) as bridge:
            deep = (
                json.dumps(private_message(BOT, 42, "x"))[:-1]
                + ', "extra": '
                + "[" * 10_000
                + "]" * 10_000
                + "}"
            )
            await bridge.send_raw(deep)
            await bridge.send_raw(json.dumps(private_message(BOT, 42, "bad \ud800 text")))
            await bridge.send_raw(json.dumps(private_message(BOT, 42, "bad \x00 text")))
            await bridge.send_event(private_message(BOT, 42, "still there?"))
            [action] = await bridge.wait_for_actions(1)
            assert bridge.close_code is None
        assert "still there?" in json.dumps(action.params)
        assert await count(srv.runtime, inbox) == 1
