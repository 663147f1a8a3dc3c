"""/handoff tells both ends: the target chat gets a notice when a conversation arrives,
and `/handoff back` tells the other end, whichever side sends it. What the handing-off
person still writes in the original chat joins the session and is answered in the target
chat. Two fake platforms: the Telegram Bot API (the real PTB Bot against the fake) and the
signed webhook delivering to a callback receiver (in Chinese)."""

from __future__ import annotations

import json

import httpx

from tests.agents.test_handoff import key_of
from tests.agents.test_links import AUTH, telegram_says
from tests.agents.test_session_commands import say
from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.telegram.support import post_update, tg_settings
from tests.conftest import ServeApp, webhook_settings
from tests.fakes import telegram as tg
from tests.fakes.http_receiver import HttpReceiver
from tests.fakes.openai_server import FakeOpenAI, text
from tests.fakes.telegram import FakeTelegram
from tests.support.timing import eventually

ARRIVED_ZH = "这段对话已从 telegram 转到这里继续。发送 /handoff back 可将其转回。"
WENT_BACK_ZH = "对话已转回 telegram，这个聊天重新拥有自己的对话。"
BACK_HERE = "The conversation is back here, handed back from webhook."
DONE = "This conversation now continues in your direct chat on webhook."


def delivered(receiver: HttpReceiver) -> list[tuple[str, str]]:
    """(chat_id, text) of what the webhook's callback received, in order."""
    bodies = [json.loads(r.body) for r in receiver.received]
    return [(b["chat_id"], b["text"]) for b in bodies]


async def test_handoff_notices_at_both_ends_and_the_original_chat_is_answered_in_the_target(
    serve: ServeApp,
) -> None:
    async with FakeTelegram() as tg_fake, FakeOpenAI() as fake, HttpReceiver() as receiver:
        fake.default = text("ok")
        channels = {
            "telegram": tg_settings(tg_fake),
            "webhook": webhook_settings(callback_url=receiver.url, locale="zh"),
        }
        running = serve(channel_settings=channels, **openai_settings(fake))
        async with running as srv, httpx.AsyncClient(timeout=30) as client:
            assert await say(client, srv, "hello from the web", chat="u1dm", sender="u1") == "ok"
            assert await telegram_says(client, srv, tg_fake, 1, "remember the milk") == "ok"
            for identity in ("telegram:4242", "webhook:u1"):
                resp = await client.post(
                    f"{srv.url}/admin/api/identity-links",
                    json={"identity": identity, "person_id": "alice"},
                    headers=AUTH,
                )
                assert resp.status_code == 200, resp.text

            # /handoff from Telegram: the answer there, a notice in the webhook chat (in Chinese)
            assert await telegram_says(client, srv, tg_fake, 2, "/handoff webhook") == DONE
            await eventually(lambda: ("u1dm", ARRIVED_ZH) in delivered(receiver), timeout=15)

            # still writing on Telegram: it joins the session, the answer goes to the target
            told = len(tg_fake.calls_of("sendMessage"))
            fake.enqueue(text("answered over there"))
            resp = await post_update(client, srv.url, tg.update(3, tg.message("one more thing")))
            assert resp.status_code == 200
            await eventually(lambda: ("u1dm", "answered over there") in delivered(receiver), timeout=15)
            assert await key_of(srv, "one more thing") == "telegram:4242"
            assert ("user", "one more thing") in [
                (m["role"], m.get("content")) for m in fake.requests[-1].body["messages"]
            ]

            # /handoff back from the target: answered there, the original chat is told
            assert await say(client, srv, "/handoff back", chat="u1dm", sender="u1") == (
                "已交回：各聊天重新拥有各自的对话。"
            )
            await tg_fake.wait_for("sendMessage", told + 1)
            assert tg_fake.calls_of("sendMessage")[-1].params["text"] == BACK_HERE
            assert len(tg_fake.calls_of("sendMessage")) == told + 1  # nothing else reached Telegram

            # again, and /handoff back from the original chat: the target is told
            assert await telegram_says(client, srv, tg_fake, 4, "/handoff webhook") == DONE
            back = await telegram_says(client, srv, tg_fake, 5, "/handoff back")
            assert back == "Handed back: each chat has its own conversation again."
            await eventually(lambda: ("u1dm", WENT_BACK_ZH) in delivered(receiver), timeout=15)
            # after that, Telegram is answered on Telegram again
            assert await telegram_says(client, srv, tg_fake, 6, "and now?") == "ok"
        assert [t for c, t in delivered(receiver) if t in (ARRIVED_ZH, WENT_BACK_ZH)] == [
            ARRIVED_ZH,
            ARRIVED_ZH,
            WENT_BACK_ZH,
        ]
