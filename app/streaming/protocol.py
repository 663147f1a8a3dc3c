"""What a channel provides to stream: its `Streamer`, and the setting that chooses it."""

from __future__ import annotations

from enum import StrEnum
from typing import Protocol, runtime_checkable

from app.channel import SendResult
from app.events import OutboundMessage


class StreamingMode(StrEnum):
    """`<CHANNEL>_STREAMING`: how a reply shows while the turn runs.

    `off`: the final answer as one plain message (chunked when long), as before;
    `edit`: a preview message edited in place, the final answer as its last edit;
    `native`: the platform's own streaming API (where a channel implements it).
    """

    OFF = "off"
    EDIT = "edit"
    NATIVE = "native"


class Streamer(Protocol):
    """A channel's preview calls. Previews are best-effort; `finish` is a delivery.

    Every message given is a reply as the outbox would send it (target chat, thread,
    quote), its text the preview's current view. Calls raise the `app.errors`
    delivery errors; `ChannelRateLimited.retry_after` slows the preview down.
    """

    @property
    def edit_interval(self) -> float:
        """Seconds between two edits of one preview (the platform's rate limit)."""
        ...

    @property
    def max_preview_chars(self) -> int:
        """Longer previews are cut (the final answer is split instead)."""
        ...

    async def typing(self, message: OutboundMessage) -> None:
        """Show that the bot is working in the message's chat (a no-op where there is none)."""

    async def open(self, message: OutboundMessage) -> str:
        """Send the preview; its platform message id."""
        ...

    async def edit(self, message: OutboundMessage, preview_id: str) -> None:
        """Replace the preview's text."""

    async def finish(self, message: OutboundMessage, preview_id: str) -> SendResult:
        """Deliver the final answer as the preview's last edit (more messages when long).

        Called by the outbox sender, retried like `send`; editing to the text the
        preview already shows counts as success, and a preview that is gone is
        replaced by a new message.
        """
        ...


@runtime_checkable
class CardEdits(Protocol):
    """A streamer whose edits update a card through the platform's streaming API (a DingTalk
    AI card, a Feishu CardKit card) rather than a chat message: those edits are paced by
    the channel's `card` bucket where it has one (docs/operations.md "Pacing")."""

    def edits_card(self, preview_id: str) -> bool:
        """Whether editing this preview updates a card (not a chat message)."""
        ...


@runtime_checkable
class StreamingChannel(Protocol):
    def streamer(self) -> Streamer | None:
        """This channel's streamer, or None when its streaming setting is `off`."""
        ...
