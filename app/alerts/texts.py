"""What an alert says, in the operator's language."""

from __future__ import annotations

TITLES = {
    "en": {
        "database": "database unreachable",
        "outbox": "replies are not being delivered",
        "dead_letters": "events are failing (dead letters)",
        "model": "the model keeps failing",
        "connection": "a platform connection is down",
        "memory": "memory above the ceiling",
        "conflict": "a platform refuses the connection as a conflict (409)",
        "cron": "a scheduled job's result was not delivered",
    },
    "zh": {
        "database": "数据库无法连接",
        "outbox": "回复未能送达",
        "dead_letters": "事件处理失败（死信）",
        "model": "模型连续出错",
        "connection": "平台连接中断",
        "memory": "内存超过上限",
        "conflict": "平台以冲突（409）拒绝连接",
        "cron": "定时任务的结果未能送达",
    },
}

FIRING = {"en": "🔴 chatgate alert: {title}\n{detail}", "zh": "🔴 chatgate 告警：{title}\n{detail}"}
RESOLVED = {"en": "🟢 chatgate recovered: {title}", "zh": "🟢 chatgate 已恢复：{title}"}


def alert_text(language: str, kind: str, detail: str, *, resolved: bool) -> str:
    title = TITLES[language].get(kind, kind)
    template = RESOLVED[language] if resolved else FIRING[language]
    return template.format(title=title, detail=detail)
