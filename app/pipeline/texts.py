"""What the gateway itself says in chats, in each language it speaks (`en`, `zh`).

The locale is the channel's (`<CHANNEL>_LOCALE`), else English. Add a text here with
both languages; `say` falls back to English for a locale without it.
"""

from __future__ import annotations

from typing import Any

TEXTS: dict[str, dict[str, str]] = {
    "new.done": {"en": "Started a new conversation.", "zh": "已开始新的对话。"},
    "reset.done": {
        "en": "The conversation was reset. Earlier messages are kept but no longer used.",
        "zh": "对话已重置。之前的消息仍保留，但不再使用。",
    },
    "end.done": {
        "en": "Conversation ended. Send a message to start a new one.",
        "zh": "对话已结束。发送消息即可开始新的对话。",
    },
    "stop.nothing": {"en": "Nothing is running.", "zh": "当前没有正在运行的任务。"},
    "failed": {"en": "Sorry, I could not process your message.", "zh": "抱歉，无法处理你的消息。"},
    "not_allowed": {"en": "You are not allowed to use {command} here.", "zh": "你无权在此使用 {command}。"},
    "help.title": {"en": "Commands:", "zh": "可用命令："},
}

LOCALES = ("en", "zh")


def say(key: str, locale: str = "en", **values: Any) -> str:
    """The text `key` in `locale` (English if it has none), with `values` filled in."""
    texts = TEXTS[key]
    return texts.get(locale, texts["en"]).format(**values)
