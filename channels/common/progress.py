"""Progress on platforms that cannot edit a sent message (WeCom, Official Account, OneBot, QQ).

`ProgressStreamer` is an `app.streaming.Streamer` without previews: it shows the
platform's typing state where there is one (the Official Account's
`custom/typing`) and, when configured, one short "working…" notice once a turn has run
for `notice_after` seconds. There is no preview message to edit, so `open` sends nothing
and `finish`, the outbox's delivery of the answer, is the channel's ordinary `send`:
the answer is delivered exactly once, as without streaming.

The notice is best-effort and sent at most once per answered event in this process (a
turn re-run after a restart may show it again). On QQ it uses one of the passive replies
a message allows, on the Official Account one of its five customer-service messages.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from app.channel import SendResult
from app.events import OutboundMessage, TextPart
from app.streaming.protocol import StreamingMode

NO_PREVIEW = "-"  # the stored "preview id": nothing was sent
_KEPT = 10_000

NOTICE_TEXTS = {"en": "⏳ Working on it…", "zh": "⏳ 正在处理，请稍候…"}


def check_streaming(channel: str, value: StreamingMode, allowed: tuple[StreamingMode, ...]) -> StreamingMode:
    """For a `streaming` validator: only the modes the platform has (no `edit`: no previews)."""
    if value not in allowed:
        names = " or ".join(m.value for m in allowed)
        raise ValueError(
            f"{channel} cannot edit a sent message, so there are no previews; use {names} "
            "(a 'working…' notice is WORKING_NOTICE_SECONDS)"
        )
    return value


class ProgressStreamer:
    def __init__(
        self,
        send: Callable[[OutboundMessage], Awaitable[SendResult]],
        *,
        locale: str,
        notice_after: float | None,
        show_typing: Callable[[OutboundMessage], Awaitable[None]] | None = None,
        typing_every: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._notice = NOTICE_TEXTS.get(locale, NOTICE_TEXTS["en"])
        self._notice_after = notice_after
        self._show_typing = show_typing
        self._typing_every = typing_every
        self._clock = clock
        self._started: OrderedDict[str, float | None] = OrderedDict()  # event -> start; None: noticed
        self._typed: OrderedDict[str, float] = OrderedDict()  # chat -> last typing state

    # Nothing is edited: the hub's preview loop only calls the no-op `edit`, rarely.
    edit_interval = 5.0
    max_preview_chars = 4000

    async def typing(self, message: OutboundMessage) -> None:
        """Called every few seconds while a turn runs: typing, then the notice when due."""
        now = self._clock()
        if self._show_typing is not None:
            last = self._typed.get(message.chat_id)
            if last is None or now - last >= self._typing_every:
                _remember(self._typed, message.chat_id, now)
                await self._show_typing(message)
        event = message.in_reply_to_event
        if self._notice_after is None or event is None:
            return
        if event not in self._started:
            _remember(self._started, event, now)
            return
        started = self._started[event]
        if started is not None and now - started >= self._notice_after:
            self._started[event] = None  # at most once, even if the send fails
            notice = message.model_copy(update={"parts": (TextPart(text=self._notice),)})
            await self._send(notice)

    async def open(self, message: OutboundMessage) -> str:
        return NO_PREVIEW

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        return None

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        if message.in_reply_to_event is not None:
            self._started.pop(message.in_reply_to_event, None)
        return await self._send(message)


def _remember(store: OrderedDict[str, Any], key: str, value: float) -> None:
    store[key] = value
    store.move_to_end(key)
    while len(store) > _KEPT:
        store.popitem(last=False)
