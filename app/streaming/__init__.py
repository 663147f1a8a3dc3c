"""Streaming replies on chat platforms: previews edited in place while a turn runs.

A channel that can show a reply while it is being written provides a `Streamer`
(`StreamingChannel.streamer()`, chosen once at start-up from `<CHANNEL>_STREAMING`).
`PreviewHub` (`app.streaming.hub`) watches what the turn publishes on the session feed
(answer deltas, tool calls, the final answer) and drives each conversation's preview;
the final answer still goes through the outbox, exactly once, as the preview's last edit
(`PreviewDelivery`).

This package face re-exports only the channel-side contract (`protocol`): importing it
must not load the hub, which needs the pipeline and the tables. Channels import
`app.streaming.protocol` (and `app.streaming.settings`); the runtime imports
`app.streaming.hub`.
"""

from app.streaming.protocol import Streamer, StreamingChannel, StreamingMode

__all__ = ["Streamer", "StreamingChannel", "StreamingMode"]
