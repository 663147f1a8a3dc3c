"""`StreamingSettings`: the `<CHANNEL>_STREAMING…` settings every streaming channel has.

A mixin for a channel's settings class (`class TelegramSettings(StreamingSettings,
ChannelSettings)`); a channel whose platform allows a faster or slower edit rate
overrides `stream_edit_seconds` with its own default.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, Field, field_validator

from app.streaming.protocol import StreamingMode


class StreamingSettings(BaseModel):
    # The modes this channel implements (a class attribute, not a setting).
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset({StreamingMode.OFF, StreamingMode.EDIT})

    streaming: StreamingMode = Field(
        StreamingMode.EDIT,
        description="off (one message at the end), edit (a preview sent, then edited in place while "
        "the turn runs; the answer is its last edit), native (the platform's own streaming, where the "
        "channel has it: Telegram drafts, Slack chat.startStream).",
    )
    stream_edit_seconds: float = Field(
        1.0, ge=0.05, description="Least time between two edits of a preview (the platform's rate limit)."
    )

    @field_validator("streaming")
    @classmethod
    def _streaming_implemented(cls, value: StreamingMode) -> StreamingMode:
        if value not in cls.streaming_modes:
            allowed = ", ".join(sorted(m.value for m in cls.streaming_modes))
            raise ValueError(
                f"streaming mode {value.value!r} is not implemented for this channel; use {allowed}"
            )
        return value
