"""Native streaming on Slack (`SLACK_STREAMING=native`): `chat.startStream`, `chat.appendStream`,
`chat.stopStream`.

A streamed message is append-only: `startStream` opens it (under the user's message, as
Slack wants: "streamed messages should always be replies to a user request"), each
`appendStream` adds markdown at its end, `stopStream` adds the last piece and finalizes
it. The preview hub hands this streamer the whole current view; what is appended is the
part past what the stream already shows (coalesced: after a 429 the next append carries
everything missed). A view that rewrites earlier text (a tool line turning to ✓) cannot
be appended and waits for the answer.

The answer (an outbox delivery, `finish`) ends the stream: `stopStream` with the rest of
the answer when the stream shows a prefix of it; otherwise (the stream showed tool lines,
or this process does not know what it shows — a restart, a retry after a lost answer, a
stream Slack already closed) the stream is stopped and the message's text replaced by the
answer with `chat.update`. A refused `startStream` (`PreviewUnavailable`) leaves the turn
without a preview; its answer is then posted normally.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from app.channel import SendResult
from app.errors import ChannelRejected, ChannelUnavailable, PreviewUnavailable
from app.events import OutboundMessage
from channels.common.steps import held_media
from channels.slack.text import split_text

if TYPE_CHECKING:
    from channels.slack.outbound import SlackOutbound
    from channels.slack.settings import SlackSettings

_REMEMBERED = 1000  # streams whose shown text this process keeps


class SlackNativeStreamer:
    """Previews as one Slack stream per answer; Slack has no typing state for bots."""

    def __init__(self, outbound: SlackOutbound, settings: SlackSettings) -> None:
        self.outbound = outbound
        self.settings = settings
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = settings.max_message_chars
        self._shown: OrderedDict[str, str] = OrderedDict()  # stream ts -> the markdown it shows

    async def typing(self, message: OutboundMessage) -> None:
        return None

    async def open(self, message: OutboundMessage) -> str:
        thread_ts = _thread_ts(message)
        if thread_ts is None:
            raise PreviewUnavailable("no user message to stream the answer under")
        args: dict[str, Any] = dict(channel=message.chat_id, thread_ts=thread_ts, markdown_text=message.text)
        if not message.chat_id.startswith("D"):  # outside a DM Slack wants the recipient named
            args.update(
                recipient_user_id=message.metadata.get("reply_slack_user"),
                recipient_team_id=message.metadata.get("reply_slack_team"),
            )
        try:
            resp = await self.outbound.call("chat_startStream", **args)
        except ChannelRejected as exc:
            raise PreviewUnavailable(f"Slack refused chat.startStream: {exc.detail}") from exc
        ts = resp.get("ts")
        if not ts:
            raise ChannelUnavailable("Slack answered chat.startStream without a ts")
        self._remember(str(ts), message.text)
        return str(ts)

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        shown, text = self._shown.get(preview_id), message.text
        if shown is None or len(text) <= len(shown) or not text.startswith(shown):
            return  # unknown (a restart) or a rewrite: the answer completes the message
        await self.outbound.call(
            "chat_appendStream", channel=message.chat_id, ts=preview_id, markdown_text=text[len(shown) :]
        )
        self._remember(preview_id, text)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = held_media(message)
        thread_ts = _thread_ts(message)

        async def deliver(index: int, chunk: str) -> str | None:
            if index >= len(chunks):
                await self.outbound.upload(message.chat_id, media[index - len(chunks)], thread_ts)
                return None
            if index > 0:
                return await self.outbound.post(message.chat_id, chunk, thread_ts)
            return await self._complete(message, preview_id, chunk)

        return await self.outbound.reply(message.message_id, chunks, len(media), deliver, shown=preview_id)

    async def _complete(self, message: OutboundMessage, ts: str, text: str) -> str | None:
        """End the stream showing exactly `text`; the message's ts (a new one if it was deleted)."""
        shown = self._shown.get(ts)
        rest = text[len(shown) :] if shown is not None and text.startswith(shown) else None
        try:
            await self.outbound.call(
                "chat_stopStream", channel=message.chat_id, ts=ts, markdown_text=rest or None
            )
        except ChannelRejected as exc:
            if "message_not_found" in exc.detail:
                return await self.outbound.post(message.chat_id, text, _thread_ts(message))
            rest = None  # already stopped (a retry, a restart, Slack's own timeout): replace the text
        self._shown.pop(ts, None)
        if rest is not None:
            return ts
        try:
            await self.outbound.call("chat_update", channel=message.chat_id, ts=ts, text=text)
        except ChannelRejected as exc:
            if "message_not_found" not in exc.detail:
                raise
            return await self.outbound.post(message.chat_id, text, _thread_ts(message))
        return ts

    def _remember(self, ts: str, shown: str) -> None:
        self._shown[ts] = shown
        self._shown.move_to_end(ts)
        while len(self._shown) > _REMEMBERED:
            self._shown.popitem(last=False)


def _thread_ts(message: OutboundMessage) -> str | None:
    """The thread the answer streams into: the reply's thread, else under the user's message."""
    return message.thread_id or message.metadata.get("reply_slack_ts")
