"""What the sender is told of budgets, in English and Chinese."""

from __future__ import annotations

from app.usage_settings import Budget

_WHOSE = {
    "en": {"sender": "Your", "chat": "This chat's", "agent": "This assistant's", "deployment": "This bot's"},
    "zh": {"sender": "你的", "chat": "本群聊的", "agent": "此助手的", "deployment": "此机器人的"},
}
_PERIOD = {"en": {"day": "daily", "month": "monthly"}, "zh": {"day": "今日", "month": "本月"}}
_RESETS = {
    "en": {"day": "It resets at 00:00 UTC.", "month": "It resets on the 1st of the month (UTC)."},
    "zh": {"day": "额度将在 UTC 0 点重置。", "month": "额度将在每月 1 日（UTC）重置。"},
}


def budget_text(locale: str, budget: Budget, *, reached: bool, share: float = 1.0) -> str:
    lang = "zh" if locale.startswith("zh") else "en"
    whose, period = _WHOSE[lang][budget.scope], _PERIOD[lang][budget.period]
    if lang == "zh":
        if reached:
            return f"{whose}{period}用量预算已用完，本条消息不会发送给模型。{_RESETS[lang][budget.period]}"
        return f"提醒：{whose}{period}用量预算已使用 {share:.0%}。"
    if reached:
        return (
            f"{whose} {period} usage budget is spent, so this message was not sent to the model. "
            f"{_RESETS[lang][budget.period]}"
        )
    return f"Note: {whose.lower()} {period} usage budget is {share:.0%} used."
