"""Streamed replies on Discord: a preview message sent, then edited in place.

`POST /channels/{id}/messages` opens the preview (for a slash command: the deferred
answer, `PATCH …/messages/@original`), `PATCH /channels/{id}/messages/{message id}` edits
it, `POST /channels/{id}/typing` shows the typing state (about 10 s each). Discord allows
about five message edits per five seconds per channel (`DISCORD_STREAM_EDIT_SECONDS`); a
429 carries `retry_after`, which slows the preview down (`ChannelRateLimited`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from app.channel import SendResult
from app.events import APPROVAL_KEY, OutboundMessage
from channels.common.chunks import split_text
from channels.common.steps import held_media
from channels.discord.native import approval_components
from channels.discord.outbound import DiscordOutbound, UnknownMessage

if TYPE_CHECKING:
    from channels.discord.settings import DiscordSettings


class DiscordStreamer:
    def __init__(self, outbound: DiscordOutbound, settings: DiscordSettings) -> None:
        self.outbound = outbound
        self.settings = settings
        self.edit_interval = settings.stream_edit_seconds
        self.max_preview_chars = settings.max_message_chars

    async def typing(self, message: OutboundMessage) -> None:
        if _interaction(message) is None:  # a deferred slash command shows "thinking…" already
            await self.outbound.typing(_channel_id(message))

    async def open(self, message: OutboundMessage) -> str:
        hook = _interaction(message)
        if hook is not None:
            return await self.outbound.call(
                "PATCH", f"{hook}/messages/@original", {"content": message.text}, auth=False
            )
        return await self.outbound.call(
            "POST", f"/channels/{_channel_id(message)}/messages", {"content": message.text}
        )

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        await self._edit_text(message, preview_id, message.text)

    async def _edit_text(
        self, message: OutboundMessage, preview_id: str, text: str, *, last: bool = False
    ) -> None:
        body: dict[str, Any] = {"content": text}
        if last and APPROVAL_KEY in message.metadata:  # an approval prompt ends the preview
            body["components"] = approval_components(message.metadata[APPROVAL_KEY], self.settings.locale)
        hook = _interaction(message)
        if hook is not None:
            await self.outbound.call("PATCH", f"{hook}/messages/{preview_id}", body, auth=False)
        else:
            await self.outbound.call("PATCH", f"/channels/{_channel_id(message)}/messages/{preview_id}", body)

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        chunks = split_text(message.text, self.settings.max_message_chars)
        media = held_media(message)

        async def deliver(index: int, chunk: str) -> str:
            if index > 0 or not chunks:
                return await self.outbound.deliver_step(message, index, chunks, media)
            try:
                await self._edit_text(message, preview_id, chunk, last=len(chunks) == 1)
            except UnknownMessage:
                # The preview was deleted: the answer replaces it as a new message.
                return await self.outbound.deliver_step(message, index, chunks, media)
            return preview_id

        return await self.outbound.reply(message.message_id, chunks, len(media), deliver, shown=preview_id)


def _interaction(message: OutboundMessage) -> str | None:
    """The interaction webhook a slash command is answered through, or None."""
    meta = message.metadata
    token, app_id = meta.get("reply_interaction_token"), meta.get("reply_application_id")
    return f"/webhooks/{app_id}/{token}" if token and app_id else None


def _channel_id(message: OutboundMessage) -> str:
    return str(message.metadata.get("reply_channel_id") or message.thread_id or message.chat_id)
