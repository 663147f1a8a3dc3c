"""A deterministic provider that needs no network.

It still exercises the whole tool-call structure: questions about the time or about the
session make it call a tool first and answer from the tool's result, so the first run of
a fresh install shows user → assistant(tool_calls) → tool → assistant in the history.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence

from app.agent.provider import DeltaCallback, ProviderReply, ToolSpec, Usage
from app.sessions.messages import ChatMessage, estimate_tokens, tool_call

_TIME_WORDS = ("time", "date", "clock", "几点", "时间")
_SESSION_WORDS = ("how many messages", "session info", "this session", "消息")
# A CJK character alone, or a run of anything else up to and including its trailing spaces.
_MAX_PIECES = 32
_PIECE = re.compile(r"[\u3000-\u9fff\uff00-\uffef]|[^\s\u3000-\u9fff\uff00-\uffef]*\s*")


class OfflineProvider:
    name = "offline"

    def __init__(self, latency_ms: int = 0, stream_delay_ms: int = 0) -> None:
        self.latency = latency_ms / 1000
        self.stream_delay = stream_delay_ms / 1000

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        on_delta: DeltaCallback | None = None,
    ) -> ProviderReply:
        if self.latency:
            await asyncio.sleep(self.latency)
        usage = Usage(prompt_tokens=sum(estimate_tokens(m) for m in messages), completion_tokens=8)
        last = messages[-1] if messages else None
        if last is not None and last.role == "tool":
            answer = self._answer_from_tools(messages)
            await self._stream(answer, on_delta)
            return ProviderReply(content=answer, usage=usage, model="offline")
        user = next((m for m in reversed(messages) if m.role == "user"), None)
        text = (user.content or "") if user else ""
        available = {t.name for t in tools}
        lowered = text.lower()
        call: tuple[str, dict[str, object]] | None = None
        if "current_time" in available and any(w in lowered for w in _TIME_WORDS):
            call = ("current_time", {})
        elif "session_info" in available and any(w in lowered for w in _SESSION_WORDS):
            call = ("session_info", {})
        if call is not None:
            call_id = "call_" + hashlib.sha256(f"{user and user.seq}:{text}".encode()).hexdigest()[:12]
            return ProviderReply(
                content=None, tool_calls=(tool_call(call_id, *call),), usage=usage, model="offline"
            )
        reply = f"You said: {text}" if text else "Hello! Send me a message."
        await self._stream(reply, on_delta)
        return ProviderReply(content=reply, usage=usage, model="offline")

    async def _stream(self, text: str, on_delta: DeltaCallback | None) -> None:
        """Hand the answer out in pieces, as a real model streams it: a word (with the
        space after it) or one CJK character at a time, `stream_delay` apart, in at most
        `_MAX_PIECES` pieces."""
        if on_delta is None:
            return
        pieces = [p for p in _PIECE.findall(text) if p]
        if len(pieces) > _MAX_PIECES:  # a long answer comes in bigger pieces, not for longer
            size = -(-len(pieces) // _MAX_PIECES)
            pieces = ["".join(pieces[i : i + size]) for i in range(0, len(pieces), size)]
        for i, piece in enumerate(pieces):
            if i and self.stream_delay:
                await asyncio.sleep(self.stream_delay)
            await on_delta(piece)

    @staticmethod
    def _answer_from_tools(messages: Sequence[ChatMessage]) -> str:
        results = []
        for m in reversed(messages):
            if m.role != "tool":
                break
            results.append(m)
        lines = []
        for m in reversed(results):
            try:
                data = json.loads(m.content or "")
            except ValueError:
                data = m.content
            if m.name == "current_time" and isinstance(data, dict) and "iso" in data:
                lines.append(f"It is {data['iso']} ({data.get('timezone', 'UTC')}).")
            elif m.name == "session_info" and isinstance(data, dict) and "message_count" in data:
                lines.append(
                    f"This session ({data.get('session_key')}) has {data['message_count']} messages."
                )
            else:
                lines.append(f"{m.name} returned: {m.content}")
        return " ".join(lines)

    async def aclose(self) -> None:
        return None
