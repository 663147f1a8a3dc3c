"""Voice notes out: WAV (16-bit PCM) or SILK audio becomes an iLink voice item.

WeChat voice is SILK v3 with Tencent's header (`\\x02#!SILK_V3`). Tencent's client
(`@tencent-weixin/openclaw-weixin`) receives voice but sends none; what a voice item
holds comes from its proto types (`api/types.ts`, `VoiceItem`): the CDN `media`,
`encode_type` 6 (SILK), `bits_per_sample`, `sample_rate` (Hz) and `playtime` (ms), and
the upload's `media_type` 4 (`UploadMediaType.VOICE`). Its inbound path decodes SILK at
24 kHz, the rate encoded here.

Encoding uses `silk-python` (`pysilk`, the SILK SDK compiled in a wheel). Audio in
another format (MP3, Ogg) is not transcoded (no decoder here): it goes out as a file.
"""

from __future__ import annotations

import array
import io
import sys
import wave
from dataclasses import dataclass

SILK_SAMPLE_RATE = 24_000  # what the encoder keeps at most, and what clients decode at
ENCODE_SILK = 6  # VoiceItem.encode_type: 1=pcm 2=adpcm 3=feature 4=speex 5=amr 6=silk …
BIT_RATE = 24_000  # bits per second of the encoded voice
# Input rates the SILK encoder accepts (its API sample rate).
_RATES = (8_000, 12_000, 16_000, 24_000, 32_000, 44_100, 48_000)
_WAV = {"audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"}
_SILK = {"audio/silk", "audio/x-silk"}
SILK_HEADER = b"\x02#!SILK_V3"
# WeChat's own voice notes stop at 60 s; a longer answer goes out as a file instead.
MAX_PLAYTIME_MS = 60_000


class NotVoice(ValueError):
    """Audio this module cannot make a voice note of (it goes out as a file)."""


@dataclass(frozen=True)
class Voice:
    silk: bytes
    playtime_ms: int


def can_voice(mime: str | None, name: str | None) -> bool:
    """Whether a file part is audio this module turns into a voice note."""
    mime = (mime or "").lower()
    lower = (name or "").lower()
    return mime in _WAV or mime in _SILK or lower.endswith((".wav", ".silk"))


def _mono_pcm(data: bytes) -> tuple[bytes, int]:
    """A WAV file's samples as mono 16-bit little-endian PCM, and their rate."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise NotVoice(f"not a PCM WAV file: {exc}") from exc
    if width != 2:
        raise NotVoice(f"{8 * width}-bit WAV: only 16-bit PCM is encoded")
    if rate not in _RATES:
        raise NotVoice(f"{rate} Hz WAV: SILK takes {', '.join(map(str, _RATES))} Hz")
    samples = array.array("h", frames)
    if sys.byteorder == "big":
        samples.byteswap()
    if channels > 1:  # mix down: the average of each frame's channels
        samples = array.array(
            "h", (sum(samples[i : i + channels]) // channels for i in range(0, len(samples), channels))
        )
    if sys.byteorder == "big":
        samples.byteswap()
    return samples.tobytes(), rate


def decode(silk: bytes, sample_rate: int = SILK_SAMPLE_RATE) -> bytes:
    """SILK to mono 16-bit PCM at `sample_rate`."""
    import pysilk

    out = io.BytesIO()
    try:
        pysilk.decode(io.BytesIO(silk), out, sample_rate)
    except Exception as exc:  # pysilk.SilkError and the backends' own errors
        raise NotVoice(f"not SILK audio: {exc}") from exc
    return out.getvalue()


def to_voice(data: bytes, mime: str | None, name: str | None) -> Voice:
    """The SILK voice note of WAV or SILK audio (CPU work: run it off the event loop)."""
    import pysilk

    mime = (mime or "").lower()
    if mime in _SILK or data.startswith((SILK_HEADER, SILK_HEADER[1:])):
        silk = data if data.startswith(SILK_HEADER) else b"\x02" + data  # WeChat's form
        pcm = decode(silk)
        return _checked(Voice(silk, len(pcm) * 1000 // (2 * SILK_SAMPLE_RATE)))
    if not can_voice(mime, name):
        raise NotVoice(f"{mime or name or 'audio'} is not encoded to SILK here")
    pcm, rate = _mono_pcm(data)
    if not pcm:
        raise NotVoice("empty audio")
    _checked(Voice(b"", len(pcm) * 1000 // (2 * rate)))  # before the CPU work
    out = io.BytesIO()
    pysilk.encode(
        io.BytesIO(pcm), out, rate, BIT_RATE, max_internal_sample_rate=SILK_SAMPLE_RATE, tencent=True
    )
    return Voice(out.getvalue(), len(pcm) * 1000 // (2 * rate))


def _checked(note: Voice) -> Voice:
    if note.playtime_ms > MAX_PLAYTIME_MS:
        raise NotVoice(f"{note.playtime_ms / 1000:.0f} s of audio: voice notes stop at 60 s")
    return note
