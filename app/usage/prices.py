"""What a model call cost: the operator's own prices first, then genai-prices' table."""

from __future__ import annotations

import asyncio

import structlog

from app.usage_settings import UsageSettings

log = structlog.get_logger(__name__)

MILLION = 1_000_000


class Prices:
    def __init__(self, settings: UsageSettings) -> None:
        self.settings = settings
        self.currency = settings.currency

    async def cost(
        self, model: str, input_tokens: int, output_tokens: int, cached_tokens: int
    ) -> float | None:
        """The call's cost in `currency`, or None when no price of the model is known.

        The table's first look at a model (importing it the first time: ~0.5 s of CPU) runs
        in a thread: on the event loop it held up every session of the replica, and the
        renewal of the leases it holds, in the middle of a turn."""
        own = self.settings.prices.get(model)
        if own is not None:
            cached_price = own.cached if own.cached is not None else own.input
            fresh = max(0, input_tokens - cached_tokens)
            return (fresh * own.input + cached_tokens * cached_price + output_tokens * own.output) / MILLION
        if self.currency != "USD":
            return None  # the table is in USD: no guessing at an exchange rate
        known = _KNOWN.get(model)
        if known is None:
            known = await asyncio.to_thread(_priced, model)
            if len(_KNOWN) >= _KNOWN_MODELS:
                _KNOWN.clear()  # bounded: a model asked again costs one more lookup
            _KNOWN[model] = known
        return _table_cost(model, input_tokens, output_tokens, cached_tokens) if known else None

    def audio_cost(self, model: str, seconds: float) -> float | None:
        """A transcription billed by duration: only the operator's own `audio_minute` (the
        table prices tokens)."""
        own = self.settings.prices.get(model)
        if own is None or own.audio_minute is None:
            return None
        return seconds / 60 * own.audio_minute


def _table_cost(model: str, input_tokens: int, output_tokens: int, cached_tokens: int) -> float:
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=input_tokens, output_tokens=output_tokens, cache_read_tokens=cached_tokens)
    return float(calc_price(usage, model_ref=model).total_price)


_KNOWN_MODELS = 256
_KNOWN: dict[str, bool] = {}  # whether the table prices a model, asked once per model


def _priced(model: str) -> bool:
    """Whether the table prices `model` (asked once per model: an unknown one raises)."""
    from genai_prices import Usage, calc_price

    try:
        calc_price(Usage(input_tokens=1, output_tokens=1), model_ref=model)
    except LookupError:
        log.info("model_price_unknown", model=model)
        return False
    return True
