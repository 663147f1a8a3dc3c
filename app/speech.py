"""Speech to text for voice messages: the OpenAI-compatible `audio/transcriptions` endpoint.

Off unless `STT_MODEL` is set. Channels get it as `ChannelContext.transcribe`; a voice
note then enters the history as the user's text (the transcript) with the audio as a part.
"""

from __future__ import annotations

from typing import Any

from app.config import Settings


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

    async def transcribe(self, audio: bytes, filename: str, mime_type: str) -> str:
        """The transcript of `audio`; raises `openai.OpenAIError` when the endpoint fails."""
        result: Any = await self.client.audio.transcriptions.create(
            model=self.model, file=(filename, audio, mime_type)
        )
        return str(result.text).strip()

    async def aclose(self) -> None:
        await self.client.close()
