"""A request that fits the model's context, or none at all.

Before each model call the run asks `ContextFit` for the window to send. The request
(system text, tool specs, window) is counted (`app.sessions.tokens`) against the model's
context less the room kept for the answer. When it does not fit:

1. consolidate now, under the turn's lease, at a legal boundary (what the after-turn
   consolidation does, thresholds ignored), and read the window again;
2. if it still does not fit, open the session's next generation, which carries the old
   one's summaries and is linked to it (`app.memory.generations`), and continue there with
   the current exchange: its user message and its newest complete tool-call group;
3. if even that does not fit, send the longest legal suffix that does; when nothing fits
   the run ends with a clear answer and no request is sent.

Without consolidation (memory off) only step 3 applies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Protocol

import structlog

from app.agent.provider import ToolSpec
from app.channel import ChannelSettings
from app.errors import ProviderError
from app.pipeline.replies import conversation_channel
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn_state import TurnState
from app.pipeline.turn_window import TurnWindow
from app.sessions.lease import SessionLease
from app.sessions.messages import ChatMessage
from app.sessions.profiles import SessionProfiles
from app.sessions.tokens import ContextLimits, count_message, count_request, text_counter
from app.sessions.window import trim_to_legal_window

log = structlog.get_logger(__name__)

SPEC_COSTS_KEPT = 256  # tool sets whose specs' cost is remembered (agents and models)


class Consolidating(Protocol):
    async def consolidate(
        self, lease: SessionLease, session_id: int, *, force: bool = False
    ) -> int | None: ...


class ContextOverflow(ProviderError):
    """Not even the newest message fits the model's context: no request is sent."""

    def __init__(self, detail: str, user_text: str) -> None:
        super().__init__(detail)
        self.user_text = user_text  # the run's answer (app.agent.loop)


def current_exchange(window: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The newest user message and, after it, the newest complete tool-call group."""
    users = [i for i, m in enumerate(window) if m.role == "user"]
    if not users:
        return []
    exchange = list(window[users[-1] :])
    groups = [i for i, m in enumerate(exchange) if m.role == "assistant" and m.tool_calls]
    return exchange if not groups else [exchange[0], *exchange[groups[-1] :]]


class ContextFit:
    def __init__(
        self,
        store: PipelineStore,
        window: TurnWindow,
        limits: ContextLimits,
        profiles: SessionProfiles,
        channel_settings: Mapping[str, ChannelSettings] | None = None,
        consolidator: Consolidating | None = None,
    ) -> None:
        self.store = store
        self.window = window
        self.limits = limits
        self.profiles = profiles  # each agent's context table
        self.channel_settings = channel_settings or {}
        self.consolidator = consolidator  # folds old messages into summaries first
        self._spec_costs: dict[tuple[str | None, tuple[str, ...]], int] = {}

    async def __call__(
        self, turn: TurnState, system: ChatMessage, window: list[ChatMessage], specs: Sequence[ToolSpec]
    ) -> list[ChatMessage]:
        count, tokenizer = text_counter(turn.model)
        budget = self.limits.budget(turn.model, self.profiles.context_tokens_of(turn.origin))
        fixed = count_message(system, count) + self._specs_cost(turn.model, specs)

        def cost(messages: Sequence[ChatMessage]) -> int:
            return fixed + sum(count_message(m, count) for m in messages)

        if cost(window) <= budget:
            return window
        log.info(
            "context_overflow", key=turn.lease.key, cost=cost(window), budget=budget, tokenizer=tokenizer
        )
        if self.consolidator is not None:
            moved = await self.consolidator.consolidate(turn.lease, turn.session.id, force=True)
            if moved is not None:
                self._consolidated(turn, moved)
                window = await self.window.load(turn)
                if cost(window) <= budget:
                    return window
            window = await self._next_generation(turn, current_exchange(window))
            if cost(window) <= budget:
                return window
        rest = trim_to_legal_window(
            window, max_tokens=budget - fixed, count_tokens=lambda m: count_message(m, count)
        )
        if not rest:
            settings = self.channel_settings.get(turn.origin.channel)
            locale = settings.locale if settings is not None else "en"
            raise ContextOverflow("context_overflow", say("context.too_long", locale))
        return rest

    def _specs_cost(self, model: str | None, specs: Sequence[ToolSpec]) -> int:
        """The tool specs' tokens, counted once per model and tool set (they do not change)."""
        key = (model, tuple(s.name for s in specs))
        cost = self._spec_costs.get(key)
        if cost is None:
            cost = count_request([], [s.to_provider() for s in specs], text_counter(model)[0])
            if len(self._spec_costs) < SPEC_COSTS_KEPT:
                self._spec_costs[key] = cost
        return cost

    def _consolidated(self, turn: TurnState, moved: int) -> None:
        turn.session = replace(turn.session, last_consolidated=moved)
        if turn.stored is not None:
            turn.stored = [m for m in turn.stored if m.seq is None or m.seq > moved]

    async def _next_generation(self, turn: TurnState, carry: list[ChatMessage]) -> list[ChatMessage]:
        """Continue the turn in the next generation, which starts with `carry`."""
        lease, old = turn.lease, turn.session
        sessions = self.store.sessions
        new, _, seqs = await self.store.next_generation(
            lease,
            old,
            conversation_channel(turn.origin),
            reason="overflow",
            run_id=turn.run_id,
            carry=carry,
        )
        log.info("context_new_generation", key=lease.key, old=old.generation, new=new.generation)
        turn.session = replace(new, next_seq=new.next_seq + len(carry))
        sessions.remember(lease.key, turn.session, fence=lease.fence)
        turn.stored = []
        self.window.keep(turn, carry, seqs)
        return await self.window.load(turn)
