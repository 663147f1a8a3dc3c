"""Summaries of a consolidated stretch of history, and stable facts about its people.

`ExtractiveSummarizer` is deterministic and needs no model (the offline path): it keeps
the first sentence of what each side said. `ProviderSummarizer` asks the configured
model and falls back to the extractive summary when the model is unavailable. Facts
("my name is …", "I prefer …") are always extracted deterministically from each user's
own messages, so each fact is attributed to the sender who wrote it. The model is asked
for facts too, but only for a stretch with a single human sender (`want_facts`): in a
room, text from one member must not be able to plant facts in another member's memory.

The summary request itself stays within the model's context (`budget`, the tokens a
prompt may cost): a stretch whose request would not fit is cut into consecutive chunks
whose requests fit, each is summarized, and the partial summaries are combined by the
model (in groups that fit, again) — no request is sent that exceeds the budget.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from app.agent.provider import ChatProvider
from app.errors import ProviderError
from app.sessions.messages import ChatMessage
from app.sessions.tokens import count_request, text_counter

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Summary:
    text: str
    facts: list[str] = field(default_factory=list)  # about the (single) sender, from the model


class Summarizer(Protocol):
    async def summarize(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_chars: int,
        want_facts: bool = False,
        budget: int | None = None,
    ) -> Summary:
        """`budget`: the most one model request's prompt may cost in tokens (None: no limit)."""
        ...


_SENTENCE_END = re.compile(r"(?<=[.!?。！？])\s+|\n+")


def first_sentence(text: str, limit: int) -> str:
    sentence = _SENTENCE_END.split(text.strip(), maxsplit=1)[0].strip()
    sentence = " ".join(sentence.split())
    return sentence if len(sentence) <= limit else sentence[: limit - 1].rstrip() + "…"


class ExtractiveSummarizer:
    """Deterministic: 'User: <first sentence>' / 'Assistant: <first sentence>' lines."""

    async def summarize(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_chars: int,
        want_facts: bool = False,
        budget: int | None = None,
    ) -> Summary:
        return Summary(self.text(messages, max_chars=max_chars))

    def text(self, messages: Sequence[ChatMessage], *, max_chars: int) -> str:
        lines: list[str] = []
        tools: Counter[str] = Counter()
        for msg in messages:
            if msg.role == "user" and (msg.content or "").strip():
                lines.append("User: " + first_sentence(msg.content or "", 160))
            elif msg.role == "assistant" and msg.tool_calls:
                tools.update(tc.get("function", {}).get("name", "?") for tc in msg.tool_calls)
            elif msg.role == "assistant" and (msg.content or "").strip():
                lines.append("Assistant: " + first_sentence(msg.content or "", 120))
        if tools:
            lines.append("Tools used: " + ", ".join(f"{n} ×{c}" for n, c in sorted(tools.items())))
        return _fit(lines, max_chars)


def _fit(lines: list[str], max_chars: int) -> str:
    """Keep lines from both ends within `max_chars`, noting how many were left out."""
    text = "\n".join(lines)
    if len(text) <= max_chars:
        return text
    budget = max_chars - 40  # room for the marker line
    head: list[str] = []
    tail: list[str] = []
    used = 0
    i, j = 0, len(lines) - 1
    take_head = True
    while i <= j:
        line = lines[i] if take_head else lines[j]
        if used + len(line) + 1 > budget:
            break
        used += len(line) + 1
        if take_head:
            head.append(line)
            i += 1
        else:
            tail.insert(0, line)
            j -= 1
        take_head = not take_head
    return "\n".join([*head, f"(… {j - i + 1} more lines)", *tail])[:max_chars]


def _one_line(text: str | None, limit: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def render_transcript(messages: Sequence[ChatMessage], *, max_chars: int) -> str:
    """The conversation as plain lines for a summarizing model (never as chat turns, so
    the request has no tool-call structure that could be illegal)."""
    lines: list[str] = []
    for msg in messages:
        if msg.role == "user":
            lines.append("User: " + _one_line(msg.content, 1000))
        elif msg.role == "assistant" and msg.tool_calls:
            fns = [tc.get("function", {}) for tc in msg.tool_calls]
            calls = ", ".join(f"{fn.get('name', '?')}({_one_line(fn.get('arguments'), 200)})" for fn in fns)
            lines.append("Assistant called " + calls)
        elif msg.role == "tool":
            lines.append(f"Tool {msg.name or ''} returned: " + _one_line(msg.content, 300))
        elif msg.role == "assistant":
            lines.append("Assistant: " + _one_line(msg.content, 1000))
    return _fit(lines, max_chars)


SUMMARY_PROMPT = (
    "You write the long-term memory of a chat assistant. Summarize the conversation "
    "excerpt below in a few short sentences: what the user wanted, what was decided or "
    "answered, open questions. Plain text, no preamble, no more than {max_chars} characters."
)
FACTS_PROMPT = (
    "You write the long-term memory of a chat assistant. Summarize the conversation "
    "excerpt below in a few short sentences (what the user wanted, what was decided or "
    "answered, open questions; at most {max_chars} characters), and list stable facts "
    "the user stated about themselves that will still be true in later conversations "
    "(name, preferences, circumstances; not requests, not facts about others), each as "
    "one short sentence starting with 'They'. Answer with JSON only: "
    '{{"summary": "...", "facts": ["They ...", "..."]}}'
)


COMBINE_PROMPT = (
    "You write the long-term memory of a chat assistant. Below are summaries of consecutive "
    "parts of one conversation, oldest first. Combine them into one summary of a few short "
    "sentences: what the user wanted, what was decided or answered, open questions. Plain "
    "text, no preamble, no more than {max_chars} characters."
)


class ProviderSummarizer:
    def __init__(self, provider: ChatProvider, *, model: str | None = None) -> None:
        self.provider = provider
        self.model = model
        self.fallback = ExtractiveSummarizer()

    def _request(self, prompt: str, body: str) -> list[ChatMessage]:
        return [ChatMessage(role="system", content=prompt), ChatMessage(role="user", content=body)]

    def _fits(self, request: Sequence[ChatMessage], budget: int | None) -> bool:
        return budget is None or count_request(request, [], text_counter(self.model)[0]) <= budget

    async def summarize(
        self,
        messages: Sequence[ChatMessage],
        *,
        max_chars: int,
        want_facts: bool = False,
        budget: int | None = None,
    ) -> Summary:
        prompt = (FACTS_PROMPT if want_facts else SUMMARY_PROMPT).format(max_chars=max_chars)
        chunks = self._chunks(list(messages), prompt, max_chars, budget)
        if len(chunks) == 1:
            return await self._one(chunks[0], prompt, max_chars, want_facts, budget)
        log.info("summary_in_chunks", chunks=len(chunks), messages=len(messages), budget=budget)
        parts = [await self._one(chunk, prompt, max_chars, want_facts, budget) for chunk in chunks]
        text = await self._combine([p.text for p in parts if p.text.strip()], max_chars, budget)
        return Summary(text, [f for p in parts for f in p.facts][:10])

    def _chunks(
        self, messages: list[ChatMessage], prompt: str, max_chars: int, budget: int | None
    ) -> list[list[ChatMessage]]:
        """Consecutive chunks whose summary requests fit `budget` (halving those that do not;
        a single message that alone does not fit is a chunk of its own)."""
        body = render_transcript(messages, max_chars=_transcript_chars(max_chars))
        if len(messages) <= 1 or self._fits(self._request(prompt, body), budget):
            return [messages]
        mid = len(messages) // 2
        return [
            *self._chunks(messages[:mid], prompt, max_chars, budget),
            *self._chunks(messages[mid:], prompt, max_chars, budget),
        ]

    async def _one(
        self,
        messages: Sequence[ChatMessage],
        prompt: str,
        max_chars: int,
        want_facts: bool,
        budget: int | None,
    ) -> Summary:
        """One summary request; the extractive summary when it fails or would not fit."""
        request = self._request(prompt, render_transcript(messages, max_chars=_transcript_chars(max_chars)))
        if not self._fits(request, budget):  # one message longer than the whole context
            return await self.fallback.summarize(messages, max_chars=max_chars)
        try:
            reply = await self.provider.complete(request, [], model=self.model)
        except ProviderError as exc:
            log.warning("summary_provider_failed", error=exc.detail)
            return await self.fallback.summarize(messages, max_chars=max_chars)
        text = (reply.content or "").strip()
        if want_facts:
            parsed = _parse_facts_reply(text)
            if parsed is not None:
                summary, facts = parsed
                if summary:
                    return Summary(summary[:max_chars], facts)
        if not text:
            return await self.fallback.summarize(messages, max_chars=max_chars)
        return Summary(text[:max_chars])

    async def _combine(self, texts: list[str], max_chars: int, budget: int | None) -> str:
        """One summary from partial ones, oldest first: by the model in groups whose requests
        fit; joined and cut (`_fit`) where even two do not fit or the model fails."""
        if len(texts) <= 1:
            return texts[0][:max_chars] if texts else ""
        prompt = COMBINE_PROMPT.format(max_chars=max_chars)
        request = self._request(prompt, "\n\n".join(f"Part {i}: {t}" for i, t in enumerate(texts, 1)))
        if not self._fits(request, budget):
            if len(texts) == 2:
                return _fit(texts, max_chars)
            mid = len(texts) // 2
            halves = [await self._combine(texts[:mid], max_chars, budget)]
            halves.append(await self._combine(texts[mid:], max_chars, budget))
            return await self._combine(halves, max_chars, budget)
        try:
            reply = await self.provider.complete(request, [], model=self.model)
        except ProviderError as exc:
            log.warning("summary_combine_failed", error=exc.detail)
            return _fit(texts, max_chars)
        return (reply.content or "").strip()[:max_chars] or _fit(texts, max_chars)


def _transcript_chars(max_chars: int) -> int:
    return max(6 * max_chars, 12_000)


def _parse_facts_reply(text: str) -> tuple[str, list[str]] | None:
    """`{"summary": "...", "facts": ["..."]}`, possibly in a code fence; None if not that."""
    body = re.sub(r"^```(?:json)?\s*|\s*```$", "", text.strip())
    try:
        data: Any = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("summary"), str):
        return None
    raw = data.get("facts")
    if not isinstance(raw, list):
        raw = []
    facts = [" ".join(f.split())[:300] for f in raw if isinstance(f, str) and f.strip()]
    return data["summary"].strip(), facts[:10]


# --- facts ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Fact:
    key: str  # same key: the newer fact replaces the older one
    content: str


_CLAUSE = r"([^.!?,;\n。！？]{1,80})"
_NAME = r"([A-Za-z\u00c0-\u024f\u4e00-\u9fff][\w'\u00c0-\u024f\u4e00-\u9fff-]{0,30}(?: [A-Z][\w'-]{0,30})?)"
_PATTERNS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"\bmy name is " + _NAME, re.I), "name", "Their name is {0}."),
    (re.compile(r"\bcall me " + _NAME, re.I), "name", "They like to be called {0}."),
    (re.compile(r"我叫([\u4e00-\u9fffA-Za-z]{1,20})"), "name", "Their name is {0}."),
    (re.compile(r"\bI live in " + _CLAUSE, re.I), "lives_in", "They live in {0}."),
    (re.compile(r"\bI (?:really )?prefer " + _CLAUSE, re.I), "prefers:{0}", "They prefer {0}."),
    (re.compile(r"\bI (?:really )?(?:like|love|enjoy) " + _CLAUSE, re.I), "likes:{0}", "They like {0}."),
    (
        re.compile(r"\bI (?:really )?(?:dislike|hate|don't like|do not like) " + _CLAUSE, re.I),
        "dislikes:{0}",
        "They dislike {0}.",
    ),
    (re.compile(r"\bI(?:'m| am) allergic to " + _CLAUSE, re.I), "allergy:{0}", "They are allergic to {0}."),
    (re.compile(r"我喜欢([^，。！？,.!?\n]{1,40})"), "likes:{0}", "They like {0}."),
    (
        re.compile(r"\bmy (favou?rite [a-z]+(?: [a-z]+)?) is " + _CLAUSE, re.I),
        "my:{0}",
        "Their {0} is {1}.",
    ),
]


def extract_facts(text: str) -> list[Fact]:
    """Stable first-person facts in one user message; questions are ignored."""
    facts: dict[str, Fact] = {}
    for sentence in re.split(r"(?<=[.!?。！？])\s*|\n+", text):
        sentence = sentence.strip()
        if not sentence or sentence.endswith(("?", "？")):
            continue
        for pattern, key, template in _PATTERNS:
            for match in pattern.finditer(sentence):
                groups = [" ".join(g.strip().split()) for g in match.groups()]
                if not all(groups):
                    continue
                norm = [g.lower() for g in groups]
                fact = Fact(key=key.format(*norm)[:190], content=template.format(*groups))
                facts[fact.key] = fact
    return list(facts.values())
