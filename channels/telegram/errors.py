"""python-telegram-bot's errors as the outbox's delivery errors (`app.errors`)."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from telegram.error import BadRequest, Forbidden, InvalidToken, NetworkError, RetryAfter, TelegramError

from app.errors import ChannelRateLimited, ChannelRejected, ChannelSendAuthError, ChannelUnavailable


def retry_after_seconds(exc: RetryAfter) -> float:
    with warnings.catch_warnings():  # PTB warns while moving from int to timedelta
        warnings.simplefilter("ignore")
        value: Any = exc.retry_after
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@contextlib.contextmanager
def telegram_errors() -> Iterator[None]:
    """PTB's errors as the outbox's delivery errors."""
    try:
        yield
    except RetryAfter as exc:
        raise ChannelRateLimited(retry_after_seconds(exc), f"Telegram flood control: {exc.message}") from exc
    except InvalidToken as exc:
        raise ChannelSendAuthError(f"Telegram refused the bot token: {exc.message}") from exc
    except Forbidden as exc:
        raise ChannelRejected(f"Telegram refused: {exc.message}") from exc
    except BadRequest as exc:
        raise ChannelRejected(f"Telegram rejected the message: {exc.message}") from exc
    except NetworkError as exc:  # TimedOut, 5xx, connection errors
        raise ChannelUnavailable(f"Telegram unreachable: {exc.message}") from exc
    except TelegramError as exc:
        raise ChannelUnavailable(f"Telegram error: {exc.message}") from exc
