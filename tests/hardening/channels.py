"""Every JSON channel, served at once, with a signer per channel built from the platform's
published rule (`tests/fakes`), so hostile bodies can be sent validly signed.

A payload is built around a placeholder string; `body_with` swaps the placeholder's JSON
for any raw JSON fragment (a lone-surrogate escape, NUL, 10,000 nested arrays …).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

from app.channel import ChannelSettings
from channels.onebot import OneBotSettings
from channels.qq import QQSettings
from tests.channels.slack.support import slack_settings
from tests.channels.telegram.support import SECRET as TG_SECRET
from tests.channels.telegram.support import tg_settings
from tests.conftest import WEBHOOK_SECRET, webhook_settings
from tests.fakes import onebot as ob
from tests.fakes import qq
from tests.fakes import slack as sl
from tests.fakes import telegram as tg
from tests.fakes.qq import QQPlatform
from tests.fakes.slack import FakeSlack
from tests.fakes.telegram import FakeTelegram
from tests.support.webhook import signed_headers as webhook_headers

PLACEHOLDER = "@@PLACEHOLDER@@"
QQ_APP_ID = "102000001"
QQ_SECRET = "naOC0ocQE3shWLAfffVLB1rhYPG7"
ONEBOT_SECRET = "onebot-post-secret"
ONEBOT_BOT = 10001


@dataclass(frozen=True)
class JsonChannel:
    name: str
    path: str
    payload: Callable[[int], dict[str, Any]]  # a valid message (numbered) whose text is PLACEHOLDER
    headers: Callable[[bytes], dict[str, str]]  # signed for this body

    def body_with(self, n: int, fragment: str) -> bytes:
        raw = json.dumps(self.payload(n))
        assert json.dumps(PLACEHOLDER) in raw
        return raw.replace(json.dumps(PLACEHOLDER), fragment, 1).encode()

    async def post(
        self, client: httpx.AsyncClient, base: str, body: bytes, query: str = ""
    ) -> httpx.Response:
        return await client.post(f"{base}{self.path}{query}", content=body, headers=self.headers(body))


def _webhook(n: int) -> dict[str, Any]:
    return {"chat_id": f"c{n}", "sender_id": "alice", "text": PLACEHOLDER, "message_id": f"m{n}"}


def _telegram(n: int) -> dict[str, Any]:
    return tg.update(n, tg.message(PLACEHOLDER))


def _slack(n: int) -> dict[str, Any]:
    return sl.event_callback(sl.dm(PLACEHOLDER), event_id=f"EvHOSTILE{n:06d}")


def _onebot(n: int) -> dict[str, Any]:
    return ob.private_message(
        ONEBOT_BOT, 4242, [{"type": "text", "data": {"text": PLACEHOLDER}}], message_id=n
    )


def _qq(n: int) -> dict[str, Any]:
    return qq.c2c_message("OPENID_ALICE", PLACEHOLDER, message_id=f"hostile{n}")


def _onebot_headers(body: bytes) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "X-Self-ID": str(ONEBOT_BOT),
        "X-Signature": ob.sign_post(ONEBOT_SECRET, body),
    }


def _telegram_headers(_body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": TG_SECRET}


JSON_CHANNELS = [
    JsonChannel("webhook", "/channels/webhook", _webhook, lambda b: webhook_headers(WEBHOOK_SECRET, b)),
    JsonChannel("telegram", "/channels/telegram", _telegram, _telegram_headers),
    JsonChannel("slack", "/channels/slack/events", _slack, lambda b: sl.signed_headers(b)),
    JsonChannel("onebot", "/channels/onebot", _onebot, _onebot_headers),
    JsonChannel("qq", "/channels/qq", _qq, lambda b: qq.signed_headers(QQ_SECRET, b, app_id=QQ_APP_ID)),
]


@contextlib.asynccontextmanager
async def json_channel_settings() -> AsyncIterator[dict[str, ChannelSettings]]:
    """Settings of every JSON channel, with the fake platforms their start-up talks to."""
    async with (
        FakeTelegram() as telegram,
        FakeSlack() as slack,
        QQPlatform(QQ_APP_ID, QQ_SECRET) as qq_platform,
    ):
        yield {
            "webhook": webhook_settings(),
            "telegram": tg_settings(telegram),
            "slack": slack_settings(slack),
            "onebot": OneBotSettings(_env_file=None, access_token="t", secret=ONEBOT_SECRET),  # type: ignore[call-arg]
            "qq": QQSettings(
                _env_file=None,  # type: ignore[call-arg]
                app_id=QQ_APP_ID,
                app_secret=QQ_SECRET,
                api_base_url=qq_platform.url,
                token_url=qq_platform.token_url,
            ),
        }
