"""Previews of the answers being written, driven by the session feed; the final answer's delivery.

`PreviewHub.observe` sees every event the turn publishes on the session feed (it tees the
bus the feed writes to, `ObservedBus`), so the pipeline needs no hook of its own. Per
session key at most one `Stream` runs (a key's turns are serialized): it shows typing
while the turn runs, and once the turn has been running for `first_preview_after`
seconds with something to show (answer text, tool calls, the "still working" line) it
sends a preview and edits it, coalescing deltas, never faster than the streamer's
`edit_interval`, slowed down by the platform's `retry_after`.

The preview's platform id is stored (`stream_previews`, keyed by the answered event)
before its first edit. The final answer goes through the outbox as always; the sender
reaches the channel through `PreviewDelivery`, which stops the stream (waiting for an
edit in flight, so no preview text lands after the answer) and delivers the answer as the
preview's last edit. After a crash the re-run turn finds the stored preview and goes on
editing it, and so does the final answer: the chat sees one message, completed once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

import structlog
from sqlalchemy.ext.asyncio import AsyncEngine

from app.bus import SessionBus
from app.channel import ChannelAdapter, SendResult, delivers
from app.errors import ChannelRateLimited, PreviewUnavailable
from app.events import InboundEvent, OutboundMessage
from app.pipeline.replies import reply_for
from app.streaming.protocol import CardEdits, Streamer
from app.streaming.records import PreviewRecords
from app.streaming.stream import Stream, StreamTexts

__all__ = ["ObservedBus", "PreviewDelivery", "PreviewHub", "StreamTexts"]

log = structlog.get_logger(__name__)

_MAX_ANSWERING = 1000  # streams remembered until their answer is delivered


class PreviewPacing(Protocol):
    """Outbound pacing as previews see it (`app.pipeline.pacing.Pacer`)."""

    async def preview(self, message: OutboundMessage, *, card: bool = False) -> bool:
        """Whether a preview (`card`: an update of a streaming card) may go now (final
        answers come first; it never waits)."""
        ...

    async def rate_limited(
        self, message: OutboundMessage, retry_after: float, *, card: bool = False
    ) -> float:
        """The platform said wait: the chat (or the card bucket) pauses for every replica."""
        ...


class PreviewHub:
    def __init__(
        self,
        engine: AsyncEngine,
        *,
        locales: Mapping[str, str] | None = None,
        first_preview_after: float = 1.0,
        still_working_after: float = 15.0,
        typing_interval: float = 4.0,
        idle_timeout: float = 600.0,
        texts: StreamTexts | None = None,
        pacing: PreviewPacing | None = None,
    ) -> None:
        self.records = PreviewRecords(engine)
        self.pacing = pacing
        self.locales = dict(locales or {})
        self.first_preview_after = first_preview_after
        self.still_working_after = still_working_after
        self.typing_interval = typing_interval
        self.idle_timeout = idle_timeout
        self.texts = texts or StreamTexts()
        self.streamers: dict[str, Streamer] = {}
        self._streams: dict[str, Stream] = {}  # by session key: the key's current turn
        self._answering: dict[str, Stream] = {}  # by event id: streams whose answer is not delivered
        self._finished: OrderedDict[str, None] = OrderedDict()  # event ids already answered
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- set-up -----------------------------------------------------------------------

    def use(self, channel: str, streamer: Streamer | None) -> None:
        """Stream on `channel` with `streamer` (chosen once, at start-up)."""
        if streamer is not None:
            self.streamers[channel] = streamer

    def observing(self, bus: SessionBus) -> ObservedBus:
        """`bus`, with every event published through it shown to this hub too."""
        return ObservedBus(bus, self)

    def wrap(self, channel: str, adapter: ChannelAdapter) -> ChannelAdapter:
        """What the outbox sender should deliver `channel`'s replies through."""
        if channel not in self.streamers:
            return adapter
        return PreviewDelivery(adapter, self, self.streamers[channel])

    async def stop(self) -> None:
        for stream in [*self._streams.values(), *self._answering.values()]:
            await self._close(stream)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def prune(self, older_than_days: float) -> int:
        """Forget previews older than the outbox's retention (0 days: keep); how many."""
        return await self.records.prune(older_than_days)

    # --- the feed side ----------------------------------------------------------------

    def observe(self, key: str, event: Mapping[str, Any]) -> None:
        """Called for each event the session feed publishes; never blocks the turn."""
        if not self.streamers:
            return
        channel = key.split(":", 1)[0]
        if channel not in self.streamers:
            return
        kind = event.get("type")
        stream = self._streams.get(key)
        if kind == "message":
            role, run_id = event.get("role"), event.get("run_id")
            if role == "user" and run_id is None:
                if not event.get("event_id"):
                    return
                if stream is None or stream.closing.is_set():
                    stream = self._new(key, channel)
                    stream.latest = str(event["event_id"])
                    self._spawn(self._begin(key, channel, stream=stream))
                elif stream.run_id is None:
                    # A later event starting the same turn (collect): the answer replies to it.
                    stream.latest = str(event["event_id"])
                    if stream.event is not None:
                        self._spawn(self._rebind(stream, stream.latest))
                return
            if run_id is None:
                return
            stream = self._for_run(key, channel, int(run_id))
            if stream is None:
                return
            if role == "assistant" and event.get("tool_calls"):
                stream.text = ""  # words before a tool call are not the answer
                for call in event["tool_calls"]:
                    stream.tools.append([str((call.get("function") or {}).get("name") or "tool"), False])
            elif role == "tool":
                for entry in stream.tools:
                    if not entry[1]:
                        entry[1] = True
                        break
            elif role == "assistant":
                # The final answer is committed: the outbox delivers it, the preview stops.
                stream.closing.set()
            stream.changed.set()
        elif kind == "delta":
            stream = self._for_run(key, channel, int(event["run_id"]))
            if stream is not None:
                stream.text += str(event.get("text") or "")
                stream.changed.set()
        elif kind == "approval_request" and stream is not None:
            stream.closing.set()  # the question is the turn's answer
            stream.changed.set()

    def _for_run(self, key: str, channel: str, run_id: int) -> Stream | None:
        stream = self._streams.get(key)
        if stream is not None and not stream.closing.is_set():
            if stream.run_id is None:
                stream.run_id = run_id
                # Several events may start one turn (collect): the answer replies to the
                # run's last one, which the run row names.
                self._spawn(self._confirm(stream, run_id))
            if stream.run_id == run_id:
                return stream
        if stream is not None and stream.run_id == run_id:
            return None  # this run's answer is done
        # A run this process saw no start of (a turn resumed after a restart).
        stream = self._new(key, channel)
        stream.run_id = run_id
        self._spawn(self._begin(key, channel, run_id=run_id, stream=stream))
        return stream

    def _new(self, key: str, channel: str) -> Stream:
        old = self._streams.get(key)
        if old is not None:
            old.closing.set()
            old.changed.set()
        stream = Stream(key, channel, self.streamers[channel], self.locales.get(channel, "en"))
        self._streams[key] = stream
        return stream

    async def _begin(
        self,
        key: str,
        channel: str,
        *,
        stream: Stream,
        event_id: str | None = None,
        run_id: int | None = None,
    ) -> None:
        """Find the event the turn answers, then run the stream's preview and typing."""
        event_id = event_id or stream.latest
        try:
            event_id, payload = await self.records.answered(event_id, run_id)
        except Exception:
            log.exception("stream_lookup_failed", session_key=key)
            payload = None
        if payload is None or self._streams.get(key) is not stream:
            self._drop(stream)
            return
        if stream.latest is not None and stream.latest != event_id:  # a later event came meanwhile
            await self._begin(key, channel, stream=stream)
            return
        event = InboundEvent.model_validate(payload)
        target = event.metadata.get("reply_target") or {}
        unanswered = bool(event.metadata.get("no_reply"))  # stored in the history, no turn runs
        if target.get("channel", event.channel) != channel or event.event_id in self._finished or unanswered:
            self._drop(stream)
            return
        self._bind(stream, event)
        stream.task = asyncio.create_task(self._preview(stream), name=f"preview:{key}")
        stream.typing = asyncio.create_task(self._typing(stream), name=f"typing:{key}")

    async def _rebind(self, stream: Stream, event_id: str) -> None:
        try:
            payload = await self.records.payload(event_id)
        except Exception:
            log.exception("stream_lookup_failed", session_key=stream.key)
            return
        if payload is not None and stream.latest == event_id:
            self._bind(stream, InboundEvent.model_validate(payload))

    def _bind(self, stream: Stream, event: InboundEvent) -> None:
        if stream.event is not None and self._answering.get(stream.event.event_id) is stream:
            del self._answering[stream.event.event_id]
        stream.event = event
        self._answering[event.event_id] = stream
        while len(self._answering) > _MAX_ANSWERING:  # answers delivered elsewhere, or never
            oldest = self._answering.pop(next(iter(self._answering)))
            oldest.closing.set()
            oldest.changed.set()

    async def _confirm(self, stream: Stream, run_id: int) -> None:
        try:
            known = stream.event.event_id if stream.event is not None else None
            payload = await self.records.run_payload(run_id, known)
        except Exception:
            log.exception("stream_lookup_failed", session_key=stream.key)
            return
        if payload is not None:
            self._bind(stream, InboundEvent.model_validate(payload))

    def _drop(self, stream: Stream) -> None:
        stream.closing.set()
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _message(self, stream: Stream, text: str) -> OutboundMessage:
        assert stream.event is not None
        return reply_for(stream.event, text)  # the reply's target, as the answer will have it

    # --- a stream's work --------------------------------------------------------------

    async def _typing(self, stream: Stream) -> None:
        deadline = stream.started + self.idle_timeout
        while not stream.closing.is_set() and time.monotonic() < deadline:
            try:
                await stream.streamer.typing(self._message(stream, ""))
            except Exception as exc:  # best-effort
                log.info("typing_failed", channel=stream.channel, error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.closing.wait(), self.typing_interval)

    async def _preview(self, stream: Stream) -> None:
        assert stream.event is not None
        # A quick answer needs no preview: wait, unless the turn ends first.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stream.closing.wait(), self.first_preview_after)
        deadline = stream.started + self.idle_timeout
        while not stream.closing.is_set() and time.monotonic() < deadline:
            view = stream.view(self.texts, self.still_working_after)
            pause = stream.streamer.edit_interval
            if view and view != stream.shown and await self._may_show(stream, view):
                try:
                    await self._show(stream, view)
                    stream.shown = view
                except ChannelRateLimited as exc:
                    pause = max(pause, exc.retry_after)
                    log.info("preview_rate_limited", channel=stream.channel, retry_after=exc.retry_after)
                    await self._pause_chat(stream, view, exc.retry_after)
                except PreviewUnavailable as exc:  # no preview here: the answer is a plain message
                    log.info("preview_unavailable", channel=stream.channel, error=exc.detail)
                    return
                except Exception as exc:  # previews are best-effort; the answer is not
                    log.warning("preview_failed", channel=stream.channel, error=str(exc))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.closing.wait(), pause)
            if stream.closing.is_set():
                break
            stream.changed.clear()
            wait = self.still_working_after - (time.monotonic() - stream.started)
            if wait <= 0:  # the "still working" time is past: show what is not shown yet, else wait
                unshown = stream.view(self.texts, self.still_working_after) != stream.shown
                wait = 0.0 if unshown else self.idle_timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.changed.wait(), wait)

    async def _may_show(self, stream: Stream, view: str) -> bool:
        """Whether the chat's pacing lets a preview go now (skipped, not queued, when not)."""
        if self.pacing is None:
            return True
        try:
            allowed = await self.pacing.preview(self._message(stream, view), card=_card_edit(stream))
        except Exception as exc:  # previews are best-effort
            log.info("preview_pacing_failed", channel=stream.channel, error=str(exc))
            return False
        if not allowed:
            log.debug("preview_paced", channel=stream.channel)
        return allowed

    async def _pause_chat(self, stream: Stream, view: str, retry_after: float) -> None:
        """A preview's 429 holds the chat's answers too, on every replica (best-effort)."""
        if self.pacing is None:
            return
        try:
            await self.pacing.rate_limited(self._message(stream, view), retry_after, card=_card_edit(stream))
        except Exception as exc:
            log.info("preview_pacing_failed", channel=stream.channel, error=str(exc))

    async def _show(self, stream: Stream, view: str) -> None:
        assert stream.event is not None
        message = self._message(stream, view)
        if stream.preview_id is None:
            row = await self.records.preview(stream.event.event_id)
            if row is not None and row["final_message_id"] is not None:
                stream.closing.set()  # already answered (before a restart)
                return
            if row is not None:
                stream.preview_id = row["platform_message_id"]
            else:
                preview_id = await stream.streamer.open(message)
                stream.preview_id = await self.records.store(
                    stream.event.event_id, stream.channel, message.chat_id, preview_id
                )
                return
        assert stream.preview_id is not None
        await stream.streamer.edit(message, stream.preview_id)

    async def _close(self, stream: Stream) -> None:
        """Stop the stream and wait for a preview call in flight: nothing lands after this."""
        stream.closing.set()
        stream.changed.set()
        for task in (stream.task, stream.typing):
            if task is not None:
                with contextlib.suppress(Exception):
                    await asyncio.shield(task)
        if self._streams.get(stream.key) is stream:
            del self._streams[stream.key]
        if stream.event is not None and self._answering.get(stream.event.event_id) is stream:
            del self._answering[stream.event.event_id]

    # --- the final answer -------------------------------------------------------------

    async def deliver(
        self, adapter: ChannelAdapter, streamer: Streamer, message: OutboundMessage
    ) -> SendResult:
        """Send `message` (an outbox row's), as its preview's last edit when there is one."""
        event_id = message.in_reply_to_event
        if event_id is None:
            return await adapter.send(message)
        stream = self._answering.get(event_id)
        if stream is not None:
            await self._close(stream)
        self._finished[event_id] = None
        while len(self._finished) > 10_000:
            self._finished.popitem(last=False)
        row = await self.records.preview(event_id)
        if row is None or row["final_message_id"] not in (None, message.message_id):
            return await adapter.send(message)  # no preview, or it already shows another reply
        if not message.text.strip():  # nothing to edit to (a media-only answer): replace it
            return await adapter.send(message)
        result = await streamer.finish(message, str(row["platform_message_id"]))
        await self.records.finished(row["id"], message.message_id)
        return result


class PreviewDelivery:
    """A channel adapter as the outbox sender sees it when the channel streams."""

    def __init__(self, adapter: ChannelAdapter, hub: PreviewHub, streamer: Streamer) -> None:
        self.adapter = adapter
        self.hub = hub
        self.streamer = streamer
        self.delivers = delivers(adapter)

    @property
    def name(self) -> str:
        return self.adapter.name

    @property
    def settings(self) -> Any:
        return self.adapter.settings

    async def start(self) -> None:
        return None  # the runtime starts the adapter itself

    async def stop(self) -> None:
        return None

    async def send(self, message: OutboundMessage) -> SendResult:
        return await self.hub.deliver(self.adapter, self.streamer, message)


class ObservedBus:
    """A session bus whose published events are also shown to a `PreviewHub`."""

    def __init__(self, bus: SessionBus, hub: PreviewHub) -> None:
        self.bus = bus
        self.hub = hub

    async def publish(self, key: str, event: dict[str, Any], *, remote: bool = True) -> None:
        await self.bus.publish(key, event, remote=remote)
        try:
            self.hub.observe(key, event)
        except Exception:  # a preview never breaks the turn
            log.exception("preview_observe_failed", session_key=key)

    def subscribe(self, key: str, maxsize: int = 1000) -> Any:
        return self.bus.subscribe(key, maxsize)

    async def start(self) -> None:
        await self.bus.start()

    async def stop(self) -> None:
        await self.bus.stop()


def _card_edit(stream: Stream) -> bool:
    """Whether the stream's next preview call edits a card (paced apart from chat messages).
    Opening the card puts a message in the chat: that is paced as one."""
    streamer, preview_id = stream.streamer, stream.preview_id
    return preview_id is not None and isinstance(streamer, CardEdits) and streamer.edits_card(preview_id)
