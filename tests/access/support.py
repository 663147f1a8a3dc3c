"""What the access tests share: a model that reports usage, and reading the database."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select

from app.agent.provider import ProviderReply, ToolSpec, Usage
from app.db.models import inbox, messages, outbox
from app.sessions.messages import ChatMessage
from tests.fakes.http_receiver import Received

CODE = re.compile(r"pairing code is ([A-Z0-9]{8})")


@dataclass
class MeteredModel:
    """Answers `echo <text>` and reports `prompt` + `completion` tokens per call."""

    prompt: int = 30
    completion: int = 10
    name: str = "metered"
    calls: list[str] = field(default_factory=list)

    async def complete(
        self, messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], *, model: str | None = None
    ) -> ProviderReply:
        user = next((m.content or "" for m in reversed(messages) if m.role == "user"), "")
        self.calls.append(user)
        return ProviderReply(content=f"echo {user}", usage=Usage(self.prompt, self.completion))

    async def aclose(self) -> None:
        return None


async def count(runtime: Any, table: Any) -> int:
    async with runtime.engine.connect() as conn:
        return int((await conn.execute(select(func.count()).select_from(table))).scalar_one())


async def stored(runtime: Any) -> dict[str, int]:
    """How many inbox rows, history messages and outbox rows there are."""
    return {
        "inbox": await count(runtime, inbox),
        "messages": await count(runtime, messages),
        "outbox": await count(runtime, outbox),
    }


def texts(received: Sequence[Received]) -> list[str]:
    return [json.loads(r.body)["text"] for r in received]


def code_in(text: str) -> str:
    found = CODE.search(text)
    assert found is not None, text
    return found.group(1)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 15) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)
