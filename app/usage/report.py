"""Usage read back: totals by day, by model, the top senders and chats (the admin API, the
dashboard and `chatgate usage`), and one sender's own usage with what their budgets leave."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import usage_records, utcnow
from app.usage_settings import Budget

_COLUMNS = {
    "day": usage_records.c.day,
    "session": usage_records.c.session_key,
    "model": usage_records.c.model,
    "sender": usage_records.c.identity,
    "chat": usage_records.c.chat,
    "channel": usage_records.c.channel,
    "agent": usage_records.c.agent,
}
GROUPS = tuple(_COLUMNS)


def _since(days: int, now: datetime) -> str:
    return (now - timedelta(days=days - 1)).strftime("%Y-%m-%d")


async def usage_by(
    engine: AsyncEngine,
    group: str,
    *,
    days: int = 30,
    limit: int = 50,
    channel: str | None = None,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Calls, tokens, transcribed seconds and cost per `group` (day, session, model, sender,
    chat, channel, agent) over the last `days` UTC days, of one channel or all; days in
    order, everything else by tokens (then seconds), most first."""
    column = _COLUMNS[group]
    tokens = func.sum(usage_records.c.input_tokens + usage_records.c.output_tokens)
    query = (
        select(
            column.label("key"),
            func.count().label("calls"),
            func.sum(usage_records.c.input_tokens).label("input_tokens"),
            func.sum(usage_records.c.output_tokens).label("output_tokens"),
            func.sum(usage_records.c.cached_tokens).label("cached_tokens"),
            func.sum(usage_records.c.audio_seconds).label("audio_seconds"),
            func.sum(usage_records.c.cost).label("cost"),
            func.max(usage_records.c.currency).label("currency"),
        )
        .where(usage_records.c.day >= _since(days, now or utcnow()))
        .group_by(column)
        .order_by(
            *(
                [column]
                if group == "day"
                else [tokens.desc(), func.sum(usage_records.c.audio_seconds).desc(), column]
            )
        )
        .limit(limit)
    )
    if channel:
        query = query.where(usage_records.c.channel == channel)
    async with engine.connect() as conn:
        rows = (await conn.execute(query)).mappings().all()
    return [
        {
            group: r["key"],
            "calls": int(r["calls"]),
            "input_tokens": int(r["input_tokens"] or 0),
            "output_tokens": int(r["output_tokens"] or 0),
            "cached_tokens": int(r["cached_tokens"] or 0),
            "audio_seconds": round(float(r["audio_seconds"] or 0.0), 3),
            "cost": round(float(r["cost"]), 6) if r["cost"] is not None else None,
            "currency": r["currency"],
        }
        for r in rows
    ]


async def own_usage(
    engine: AsyncEngine, identity: str, budgets: list[Budget], *, now: datetime | None = None
) -> dict[str, Any]:
    """One sender's tokens and cost today and this month, and what each budget that applies
    to a sender leaves them."""
    now = now or utcnow()
    today, month_start = now.strftime("%Y-%m-%d"), now.strftime("%Y-%m-01")
    out: dict[str, Any] = {}
    async with engine.connect() as conn:
        for period, first in (("day", today), ("month", month_start)):
            tokens, seconds, cost = (
                await conn.execute(
                    select(
                        func.coalesce(
                            func.sum(usage_records.c.input_tokens + usage_records.c.output_tokens), 0
                        ),
                        func.coalesce(func.sum(usage_records.c.audio_seconds), 0.0),
                        func.sum(usage_records.c.cost),
                    ).where(usage_records.c.identity == identity, usage_records.c.day >= first)
                )
            ).one()
            out[period] = {
                "tokens": int(tokens),
                "audio_seconds": round(float(seconds), 1),
                "cost": float(cost) if cost is not None else None,
            }
    out["budgets"] = [
        {
            "period": b.period,
            "limit": b.tokens if b.tokens is not None else b.cost,
            "unit": "tokens" if b.tokens is not None else "cost",
            "left": max(
                0.0,
                float(b.tokens if b.tokens is not None else b.cost or 0)
                - float(out[b.period]["tokens"] if b.tokens is not None else out[b.period]["cost"] or 0.0),
            ),
        }
        for b in budgets
        if b.scope == "sender"
    ]
    return out


_SUBJECTS = {
    "sender": usage_records.c.identity,
    "chat": usage_records.c.chat,
    "agent": usage_records.c.agent,
}


async def budget_use(
    engine: AsyncEngine, budgets: list[Budget], *, top: int = 5, now: datetime | None = None
) -> list[dict[str, Any]]:
    """Each budget with its use in the current UTC day or month: the deployment's one
    subject, or the `top` senders, chats or agents nearest their limit."""
    now = now or utcnow()
    today = now.strftime("%Y-%m-%d")
    out: list[dict[str, Any]] = []
    async with engine.connect() as conn:
        for budget in budgets:
            first = today[:8] + "01" if budget.period == "month" else today
            amount = (
                func.coalesce(func.sum(usage_records.c.cost), 0.0)
                if budget.cost is not None
                else func.coalesce(func.sum(usage_records.c.input_tokens + usage_records.c.output_tokens), 0)
            )
            window = (usage_records.c.day >= first, usage_records.c.day <= today)
            if budget.scope == "deployment":
                rows = [("deployment", (await conn.execute(select(amount).where(*window))).scalar_one())]
            else:
                subject = _SUBJECTS[budget.scope]
                query = select(subject, amount).where(*window).group_by(subject)
                rows = [(r[0], r[1]) for r in (await conn.execute(query.order_by(amount.desc()).limit(top)))]
            limit = float(budget.tokens if budget.tokens is not None else budget.cost or 0)
            out.append(
                {
                    "scope": budget.scope,
                    "period": budget.period,
                    "unit": "tokens" if budget.tokens is not None else "cost",
                    "limit": budget.tokens if budget.tokens is not None else budget.cost,
                    "since": first,
                    "subjects": [
                        {
                            "subject": name,
                            "used": round(float(used), 6) if budget.cost is not None else int(used),
                            "share": round(float(used) / limit, 4) if limit else 0.0,
                        }
                        for name, used in rows
                    ],
                }
            )
    return out
