"""A chat provider that records every request, for asserting what the model was given."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx

from app.agent.provider import ProviderReply, ToolSpec
from app.memory.summarize import SUMMARY_PROMPT
from app.sessions.messages import ChatMessage, tool_call
from tests.conftest import WEBHOOK_SECRET
from tests.support.webhook import post_webhook


class RecordingProvider:
    """Implements the ChatProvider protocol; scripted by the user's text.

    "remember: X" makes it call the `remember` tool with X; "remember for this chat: X"
    with scope session; a summary request (consolidation) is answered with a summary
    that quotes the transcript's first line; anything else gets "ok".
    """

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[list[ChatMessage]] = []

    async def complete(
        self,
        messages: Sequence[ChatMessage],
        tools: Sequence[ToolSpec],
        *,
        model: str | None = None,
        **_: Any,
    ) -> ProviderReply:
        self.calls.append(list(messages))
        if is_summary_request(messages):
            first = (messages[-1].content or "").splitlines()[0]
            if "JSON" in (messages[0].content or ""):  # facts asked for: one sender only
                body = {"summary": f"SUMMARY[{first}]", "facts": [f"They once said: {first}"]}
                return ProviderReply(content=f"```json\n{json.dumps(body)}\n```")
            return ProviderReply(content=f"SUMMARY[{first}]")
        last = messages[-1]
        if last.role == "tool":
            return ProviderReply(content=f"tool said {last.content}")
        text = last.content or ""
        for prefix, scope in (("remember for this chat:", "session"), ("remember:", "user")):
            if text.lower().startswith(prefix):
                args = {"content": text[len(prefix) :].strip(), "scope": scope}
                call = tool_call(f"call_{len(self.calls)}", "remember", args)
                return ProviderReply(content=None, tool_calls=(call,))
        return ProviderReply(content="ok")

    async def aclose(self) -> None:
        return None

    def since(self, mark: int) -> list[list[ChatMessage]]:
        """Agent-run requests after `mark` (summary requests of consolidation left out: they
        may belong to another session whose after-turn hook is still running)."""
        return [c for c in self.calls[mark:] if not is_summary_request(c)]


def is_summary_request(call: Sequence[ChatMessage]) -> bool:
    return bool(call) and (call[0].content or "").startswith(SUMMARY_PROMPT[:40])


def request_text(call: Sequence[ChatMessage]) -> str:
    """Everything a model request carried, as one string."""
    out = []
    for m in call:
        out.append(m.content or "")
        if m.tool_calls:
            out.append(json.dumps(m.tool_calls))
    return "\n".join(out)


async def say(
    client: httpx.AsyncClient, url: str, chat: str, sender: str, text: str, **extra: Any
) -> dict[str, Any]:
    resp = await post_webhook(
        client, url, WEBHOOK_SECRET, {"chat_id": chat, "sender_id": sender, "text": text, **extra}, wait=True
    )
    assert resp.status_code == 200, resp.text
    return dict(resp.json())
