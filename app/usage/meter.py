"""Usage of every model call, its cost, and budgets checked before the next call.

Every call's usage (input, output and cached tokens as the provider reports them,
streamed answers included) is one `usage_records` row naming the session, sender, chat,
channel, agent and model, with its cost. Without budgets the rows are written in the
background, many per statement, off the turn's path. With budgets each row is written
at once, and before a model call the budgets of the call's sender, chat, agent and the
deployment are summed from the rows every replica writes: a spent budget refuses the
call (`BudgetReached`) with a reply in the chat's language; crossing 80 % and 95 % tells
the chat once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.loop import BudgetReached
from app.agent.provider import ProviderReply
from app.db.models import usage_records, utcnow
from app.db.outage import log_failure
from app.events import DEFAULT_AGENT, InboundEvent, agent_in_key, escape_key_component
from app.memory.identity import identity_of
from app.speech import SpeechToText, Transcript
from app.usage.prices import Prices
from app.usage.texts import budget_text
from app.usage_settings import Budget, UsageSettings

log = structlog.get_logger(__name__)

THRESHOLDS = (0.8, 0.95)
FLUSH_SECONDS = 1.0
FLUSH_ROWS = 500


@dataclass
class Payer:
    """Whose model call it is (one per turn)."""

    event: InboundEvent  # the message that started the turn
    session_key: str
    locale: str = "en"
    checked: list[float] | None = None  # the budgets' use at the last check, for its record

    @property
    def identity(self) -> str:
        return identity_of(self.event.channel, self.event.sender_id)

    @property
    def chat(self) -> str:
        return f"{escape_key_component(self.event.channel)}:{escape_key_component(self.event.chat_id)}"

    @property
    def agent(self) -> str:
        return agent_in_key(self.session_key) or DEFAULT_AGENT


def _window(period: str, now: datetime) -> tuple[str, str]:
    today = now.strftime("%Y-%m-%d")
    return (today[:8] + "01" if period == "month" else today), today


class UsageMeter:
    def __init__(
        self,
        engine: AsyncEngine,
        settings: UsageSettings,
        *,
        notify: Callable[[InboundEvent, str], Awaitable[None]] | None = None,
        on_record: Callable[[str, dict[str, Any]], None] | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`notify`: a notice to the chat of an event (80 %/95 % of a budget);
        `on_record`: each row as written (Prometheus counters)."""
        self.engine = engine
        self.settings = settings
        self.prices = Prices(settings)
        self.notify = notify
        self.on_record = on_record
        self.clock = clock
        self._pending: list[dict[str, Any]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def budgets(self) -> list[Budget]:
        return self.settings.budgets

    # --- before and after a model call ---------------------------------------------

    async def check(self, payer: Payer) -> None:
        """Refuse the call when a budget of the payer is spent."""
        if not self.budgets:
            return
        now = self.clock()
        used = [await self._used(budget, payer, now) for budget in self.budgets]
        for budget, amount in zip(self.budgets, used, strict=True):
            if amount >= _limit(budget):
                raise BudgetReached(budget_text(payer.locale, budget, reached=True))
        payer.checked = used  # what the call's record compares against

    async def record(self, payer: Payer, reply: ProviderReply, model: str | None) -> None:
        usage = reply.usage
        name = reply.model or model or "unknown"
        cost = await self.prices.cost(name, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens)
        row = self._row(
            payer, name, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens, 0.0, cost
        )
        await self._write(payer, row)

    def transcriber(self, speech: SpeechToText) -> Callable[[bytes, str, str, InboundEvent], Awaitable[str]]:
        """`ChannelContext.transcribe`: speech to text whose seconds (or tokens) are the
        voice note's sender's usage, recorded like a model call."""

        async def transcribe(audio: bytes, filename: str, mime_type: str, event: InboundEvent) -> str:
            transcript = await speech.transcribe(audio, filename, mime_type)
            try:
                await self.record_speech(Payer(event, event.session_key), transcript, speech.model)
            except Exception:  # the transcript is the user's message: keep it, whatever the meter says
                log.exception("speech_usage_not_recorded", channel=event.channel)
            return transcript.text

        return transcribe

    async def record_speech(self, payer: Payer, transcript: Transcript, model: str) -> None:
        if transcript.input_tokens or transcript.output_tokens:
            cost = await self.prices.cost(model, transcript.input_tokens, transcript.output_tokens, 0)
        else:
            cost = self.prices.audio_cost(model, transcript.seconds)
        tokens = (transcript.input_tokens, transcript.output_tokens, 0)
        await self._write(payer, self._row(payer, model, *tokens, transcript.seconds, cost))

    def _row(
        self, payer: Payer, model: str, inputs: int, outputs: int, cached: int, seconds: float, cost: Any
    ) -> dict[str, Any]:
        """One usage record: who used what, when, at what cost."""
        now = self.clock()
        return dict(
            day=now.strftime("%Y-%m-%d"),
            session_key=payer.session_key,
            identity=payer.identity,
            chat=payer.chat,
            channel=payer.event.channel,
            agent=payer.agent,
            model=model,
            input_tokens=inputs,
            output_tokens=outputs,
            cached_tokens=cached,
            audio_seconds=seconds,
            cost=cost,
            currency=self.prices.currency,
            created_at=now,
        )

    async def _write(self, payer: Payer, row: dict[str, Any]) -> None:
        name = row["model"]
        if self.on_record is not None:
            self.on_record(name, row)
        if not self.budgets:
            self._pending.append(row)
            if len(self._pending) >= FLUSH_ROWS:
                self._wake.set()
            return
        now = row["created_at"]
        before, payer.checked = payer.checked or [await self._used(b, payer, now) for b in self.budgets], None
        async with self.engine.begin() as conn:
            await conn.execute(insert(usage_records), [row])
        await self._crossed(payer, row, before)

    async def _crossed(self, payer: Payer, row: dict[str, Any], before: list[float]) -> None:
        """Tell the chat once when this call took a budget over 80 % or 95 %."""
        if self.notify is None:
            return
        for budget, used in zip(self.budgets, before, strict=True):
            spent = (
                (row["cost"] or 0.0)
                if budget.cost is not None
                else row["input_tokens"] + row["output_tokens"]
            )
            limit = _limit(budget)
            crossed = [t for t in THRESHOLDS if used < t * limit <= used + spent]
            if crossed:
                text = budget_text(payer.locale, budget, reached=False, share=max(crossed))
                try:
                    await self.notify(payer.event, text)
                except Exception:  # a notice that fails must not fail the turn
                    log.exception("budget_notice_failed", session_key=payer.session_key)

    async def _used(self, budget: Budget, payer: Payer, now: datetime) -> float:
        first, last = _window(budget.period, now)
        amount = (
            func.coalesce(func.sum(usage_records.c.cost), 0.0)
            if budget.cost is not None
            else func.coalesce(func.sum(usage_records.c.input_tokens + usage_records.c.output_tokens), 0)
        )
        query = select(amount).where(usage_records.c.day >= first, usage_records.c.day <= last)
        if budget.scope == "sender":
            query = query.where(usage_records.c.identity == payer.identity)
        elif budget.scope == "chat":
            query = query.where(usage_records.c.chat == payer.chat)
        elif budget.scope == "agent":
            query = query.where(usage_records.c.agent == payer.agent)
        async with self.engine.connect() as conn:
            return float((await conn.execute(query)).scalar_one())

    # --- the background writer (no budgets) ---------------------------------------

    async def flush(self) -> None:
        rows, self._pending = self._pending, []
        if not rows:
            return
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(usage_records), rows)
        except Exception as exc:
            log_failure(log, "usage_flush_failed", exc, rows=len(rows))
            self._pending[:0] = rows[-10 * FLUSH_ROWS :]  # kept for the next try, bounded

    async def _run(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), FLUSH_SECONDS)
            except TimeoutError:
                pass
            self._wake.clear()
            await self.flush()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="usage-writer")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()


def _limit(budget: Budget) -> float:
    return float(budget.cost if budget.cost is not None else budget.tokens or 0)
