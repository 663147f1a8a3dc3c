"""Layered long-term memory: user, session and global scopes, and consolidation.

`MemoryFeatures.from_settings(...)` bundles what the runtime wires in: the context
source that recalls memory into a run, the `remember` / `recall` tools, the
consolidation after-turn hook, and the start-up load of the global facts file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.agent.loop import ContextSource
from app.agent.provider import ChatProvider
from app.agent.tools import Tool
from app.config import Settings
from app.memory.consolidation import ConsolidationLimits, Consolidator
from app.memory.identity import IdentityLinks, identity_of
from app.memory.recall import MemoryRecall, RecallTool, RememberTool
from app.memory.store import MemoryStore, Scope
from app.memory.summarize import ExtractiveSummarizer, ProviderSummarizer, Summarizer
from app.sessions.hooks import AfterTurn

log = structlog.get_logger(__name__)

__all__ = [
    "Consolidator",
    "IdentityLinks",
    "MemoryFeatures",
    "MemoryRecall",
    "MemoryStore",
    "Scope",
    "identity_of",
]


def summarizer_for(provider: ChatProvider, model: str | None = None) -> Summarizer:
    """The offline provider gets the deterministic extractive summary; a real model summarizes."""
    if provider.name == "offline":
        return ExtractiveSummarizer()
    return ProviderSummarizer(provider, model=model)


@dataclass
class MemoryFeatures:
    store: MemoryStore
    recall: MemoryRecall
    consolidator: Consolidator | None
    enabled: bool
    global_file: str | None = None

    @classmethod
    def from_settings(
        cls,
        engine: AsyncEngine,
        settings: Settings,
        provider: ChatProvider,
        *,
        namespace_of: Callable[[str], str] | None = None,
        budget_of: Callable[[str], int | None] | None = None,
    ) -> MemoryFeatures:
        """`namespace_of`: session key → the serving agent's `memory_namespace` (memory is
        separated by it); `budget_of`: session key → the most a summary request may cost."""
        store = MemoryStore(engine)
        consolidator = None
        if settings.memory_enabled and settings.consolidation_enabled:
            consolidator = Consolidator(
                engine,
                summarizer_for(provider),
                ConsolidationLimits(
                    threshold_messages=settings.consolidation_threshold_messages,
                    threshold_tokens=settings.consolidation_threshold_tokens,
                    keep_messages=settings.consolidation_keep_messages,
                    summary_max_chars=settings.consolidation_summary_max_chars,
                ),
                namespace_of=namespace_of,
                budget_of=budget_of,
            )
        return cls(
            store=store,
            recall=MemoryRecall(
                store,
                max_items=settings.memory_recall_max_items,
                max_chars=settings.memory_recall_max_chars,
                user_in_shared_groups=settings.memory_user_recall_in_shared_groups,
                namespace_of=namespace_of,
            ),
            consolidator=consolidator,
            enabled=settings.memory_enabled,
            global_file=settings.memory_global_file,
        )

    def context_sources(self) -> list[ContextSource]:
        return [self.recall.context] if self.enabled else []

    def tools(self) -> list[Tool]:
        return [RememberTool(self.recall), RecallTool(self.recall)] if self.enabled else []

    def after_turn(self) -> list[AfterTurn]:
        return [self.consolidator] if self.consolidator is not None else []

    async def start(self) -> None:
        """Load the operator's global facts file (a broken file is logged, not fatal)."""
        if not (self.enabled and self.global_file):
            return
        try:
            count = await self.store.sync_global_file(self.global_file)
            log.info("memory_global_file_loaded", path=self.global_file, facts=count)
        except OSError as exc:
            log.error("memory_global_file_failed", path=self.global_file, error=str(exc))
