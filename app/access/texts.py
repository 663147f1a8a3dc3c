"""What the gateway says to senders it does not serve (yet), in English and Chinese."""

from __future__ import annotations

from typing import Any

TEXTS: dict[str, dict[str, str]] = {
    "pairing.code": {
        "en": "I don't know you yet. Your pairing code is {code}. Give it to the operator of this "
        "bot to be let in; it expires in {minutes} minutes.",
        "zh": "我还不认识你。你的配对码是 {code}。请把它交给此机器人的管理员以获得使用权限；"
        "{minutes} 分钟内有效。",
    },
    "quota.messages": {
        "en": "You are sending messages too fast; they are not being answered. Please wait a "
        "minute and try again.",
        "zh": "你发送消息太快了，这些消息不会被回复。请等一分钟后再试。",
    },
    "quota.tokens": {
        "en": "Today's usage limit is reached; messages are not being answered. The limit resets "
        "at 00:00 UTC.",
        "zh": "今日用量已达上限，消息不会被回复。额度将在 UTC 0 点重置。",
    },
}


def say(key: str, locale: str = "en", **values: Any) -> str:
    texts = TEXTS[key]
    return texts.get(locale, texts["en"]).format(**values)
