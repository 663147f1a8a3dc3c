"""Streaming replies on chat platforms: previews edited in place while a turn runs.

A channel that can show a reply while it is being written provides a `Streamer`
(`StreamingChannel.streamer()`, chosen once at start-up from `<CHANNEL>_STREAMING`).
`PreviewHub` watches what the turn publishes on the session feed (answer deltas, tool
calls, the final answer) and drives each conversation's preview; the final answer still
goes through the outbox, exactly once, as the preview's last edit (`PreviewDelivery`).
"""

from app.streaming.hub import PreviewDelivery, PreviewHub, StreamTexts
from app.streaming.protocol import Streamer, StreamingChannel, StreamingMode

__all__ = ["PreviewDelivery", "PreviewHub", "StreamTexts", "Streamer", "StreamingChannel", "StreamingMode"]
