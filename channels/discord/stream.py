"""Streamed replies on Discord: a preview message sent, then edited in place.

`POST /channels/{id}/messages` opens the preview (for a slash command: the deferred
answer, `PATCH …/messages/@original`), `PATCH /channels/{id}/messages/{message id}` edits
it, `POST /channels/{id}/typing` shows the typing state (about 10 s each). Discord allows
about five message edits per five seconds per channel (`DISCORD_STREAM_EDIT_SECONDS`); a
429 carries `retry_after`, which slows the preview down (`ChannelRateLimited`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from app.channel import SendResult
from app.events import FilePart, ImagePart, OutboundMessage
from channels.common.chunks import ChunkProgress, send_chunks, split_text
from channels.discord.outbound import UnknownMessage, uploads

if TYPE_CHECKING:
    from channels.discord.settings import DiscordSettings


class DiscordChannel(Protocol):
    """What the streamer needs from the channel (`channels.discord.adapter.DiscordChannel`)."""

    settings: DiscordSettings
    _progress: ChunkProgress

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None, *, auth: bool = True
    ) -> str: ...

    async def deliver_step(
        self, message: OutboundMessage, index: int, chunks: list[str], media: list[ImagePart | FilePart]
    ) -> str: ...


class DiscordStreamer:
    def __init__(self, channel: DiscordChannel) -> None:
        self.channel = channel
        self.edit_interval = channel.settings.stream_edit_seconds
        self.max_preview_chars = channel.settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        if _interaction(message) is None:  # a deferred slash command shows "thinking…" already
            await self.channel._call("POST", f"/channels/{_channel_id(message)}/typing", None)

    async def open(self, message: OutboundMessage) -> str:
        hook = _interaction(message)
        if hook is not None:
            return await self.channel._call(
                "PATCH", f"{hook}/messages/@original", {"content": message.text}, auth=False
            )
        return await self.channel._call(
            "POST", f"/channels/{_channel_id(message)}/messages", {"content": message.text}
        )

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self._edit_text(message, preview_id, message.text)

    async def _edit_text(self, message: OutboundMessage, preview_id: str, text: str) -> None:
        body = {"content": text}
        hook = _interaction(message)
        if hook is not None:
            await self.channel._call("PATCH", f"{hook}/messages/{preview_id}", body, auth=False)
        else:
            await self.channel._call("PATCH", f"/channels/{_channel_id(message)}/messages/{preview_id}", body)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.channel.settings.max_message_chars)
        media = uploads(message)

        async def deliver(index: int, chunk: str) -> str:
            if index > 0 or not chunks:
                return await self.channel.deliver_step(message, index, chunks, media)
            try:
                await self._edit_text(message, preview_id, chunk)
            except UnknownMessage:
                # The preview was deleted: the answer replaces it as a new message.
                return await self.channel.deliver_step(message, index, chunks, media)
            return preview_id

        items = [*chunks, *(f"file:{i}" for i in range(len(media)))]
        sent = await send_chunks(self.channel._progress, message.message_id, items, deliver)
        return SendResult(platform_message_id=next((m for m in sent if m), preview_id))


def _interaction(message: OutboundMessage) -> str | None:
    """The interaction webhook a slash command is answered through, or None."""
    meta = message.metadata
    token, app_id = meta.get("reply_interaction_token"), meta.get("reply_application_id")
    return f"/webhooks/{app_id}/{token}" if token and app_id else None


def _channel_id(message: OutboundMessage) -> str:
    return str(message.metadata.get("reply_channel_id") or message.thread_id or message.chat_id)
