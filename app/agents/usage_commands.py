"""/usage: a sender's own usage today and this month, and what their budgets leave."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.identity import identity_of
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies
from app.usage.report import own_usage
from app.usage_settings import UsageSettings

_TEXTS = {
    "en": {
        "title": "Your usage",
        "day": "today",
        "month": "this month",
        "line": "{period}: {tokens} tokens{seconds}{cost}",
        "seconds": ", {n} s of speech transcribed",
        "left": "{period} budget: {left} of {limit} {unit} left",
    },
    "zh": {
        "title": "你的用量",
        "day": "今日",
        "month": "本月",
        "line": "{period}：{tokens} 个令牌{seconds}{cost}",
        "seconds": "，语音转写 {n} 秒",
        "left": "{period}预算：剩余 {left} / {limit} {unit}",
    },
}


class UsageCommands:
    def __init__(self, engine: AsyncEngine, settings: UsageSettings, replies: Replies) -> None:
        self.engine = engine
        self.settings = settings
        self.replies = replies

    def commands(self) -> list[Command]:
        return [
            Command(
                "/usage",
                {
                    "en": "Your usage today and this month, and what is left.",
                    "zh": "查看你今日和本月的用量及剩余额度。",
                },
                self.usage,
            )
        ]

    async def usage(self, call: CommandCall) -> None:
        texts = _TEXTS["zh" if call.locale.startswith("zh") else "en"]
        event = call.event
        found = await own_usage(
            self.engine, identity_of(event.channel, event.sender_id), self.settings.budgets
        )
        lines = [texts["title"]]
        for period in ("day", "month"):
            used = found[period]
            cost = f" ({used['cost']:.4f} {self.settings.currency})" if used["cost"] is not None else ""
            seconds = texts["seconds"].format(n=f"{used['audio_seconds']:g}") if used["audio_seconds"] else ""
            lines.append(
                texts["line"].format(period=texts[period], tokens=used["tokens"], seconds=seconds, cost=cost)
            )
        for budget in found["budgets"]:
            unit = "tokens" if budget["unit"] == "tokens" else self.settings.currency
            left = f"{budget['left']:.0f}" if budget["unit"] == "tokens" else f"{budget['left']:.4f}"
            lines.append(
                texts["left"].format(
                    period=texts[budget["period"]], left=left, limit=budget["limit"], unit=unit
                )
            )
        await self.replies.answer(call.lease, call.row, "\n".join(lines))
