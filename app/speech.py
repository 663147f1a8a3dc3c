"""Speech to text for voice messages: the OpenAI-compatible `audio/transcriptions` endpoint.

Off unless `STT_MODEL` is set. Channels get it as `ChannelContext.transcribe`; a voice
note then enters the history as the user's text (the transcript) with the audio as a part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from app.config import Settings


@dataclass(frozen=True)
class Transcript:
    """What the endpoint heard, and what it says it used: the audio's seconds (models billed
    by duration, `whisper-1`) or tokens (`gpt-4o-transcribe`); 0 when it says neither."""

    text: str
    seconds: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0


class SpeechToText:
    def __init__(self, model: str, *, base_url: str | None, api_key: str | None, timeout: float) -> None:
        # Imported here, like the OpenAI provider: the SDK costs about a second of start-up
        # to every process (each CLI command, each server) that never transcribes.
        import openai

        self.model = model
        self.client = openai.AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout, max_retries=2
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> SpeechToText | None:
        if not settings.stt_model:
            return None
        return cls(
            settings.stt_model,
            base_url=settings.stt_base_url or settings.llm_base_url,
            api_key=settings.llm_api_key,
            timeout=settings.llm_timeout_seconds,
        )

    async def transcribe(self, audio: bytes, filename: str, mime_type: str) -> Transcript:
        """The transcript of `audio`; raises `openai.OpenAIError` when the endpoint fails."""
        result: Any = await self.client.audio.transcriptions.create(
            model=self.model, file=(filename, audio, mime_type)
        )
        text = str(result.text).strip()
        usage = getattr(result, "usage", None)
        if usage is not None and getattr(usage, "type", None) == "tokens":
            tokens = int(usage.input_tokens), int(usage.output_tokens)
            return Transcript(text, input_tokens=tokens[0], output_tokens=tokens[1])
        if usage is not None and getattr(usage, "type", None) == "duration":
            return Transcript(text, seconds=float(usage.seconds))
        # `verbose_json` answers (and some compatible servers) give the audio's duration.
        duration = getattr(result, "duration", None)
        return Transcript(text, seconds=float(duration) if isinstance(duration, (int, float)) else 0.0)

    async def aclose(self) -> None:
        await self.client.close()
