"""structlog set-up: JSON lines, context bound per event, secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any

import structlog

from app.tracing import add_trace_ids

_SECRET_KEYS = re.compile(r"(token|secret|password|api_key|authorization|signature)", re.I)


def redact_secrets(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Replace values of secret-looking keys, so a stray `token=` never reaches a log."""
    for key in list(event_dict):
        if _SECRET_KEYS.search(key) and event_dict[key] is not None:
            event_dict[key] = "[redacted]"
    return event_dict


# Shorter values are not redacted by value: they would blank ordinary words.
MIN_SECRET_CHARS = 8


def secret_values(*models: Any) -> list[str]:
    """The values of the secret-looking fields of settings objects (tokens, secrets,
    keys), as they could turn up inside a message: a library's exception that quotes the
    token it was given (python-telegram-bot's InvalidToken does), a URL with a key in it."""
    found: set[str] = set()
    for model in models:
        for name in type(model).model_fields:
            if _SECRET_KEYS.search(name):
                found.update(_strings(getattr(model, name)))
    return sorted((v for v in found if len(v) >= MIN_SECRET_CHARS), key=len, reverse=True)


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif hasattr(value, "get_secret_value"):
        yield value.get_secret_value()
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _strings(key)
            yield from _strings(item)
    elif isinstance(value, list | tuple | set | frozenset):
        for item in value:
            yield from _strings(item)
    elif hasattr(value, "token"):
        yield from _strings(value.token)


def redact_values(secrets: Iterable[str]) -> Any:
    """A processor that blanks every known secret wherever it appears in a string value
    (after exceptions are formatted, so tracebacks are covered too)."""
    known = tuple(secrets)

    def redact(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
        for key, value in event_dict.items():
            if isinstance(value, str):
                for secret in known:
                    if secret in value:
                        value = value.replace(secret, "[redacted]")
                event_dict[key] = value
        return event_dict

    return redact


class _Stderr:
    """`sys.stderr` as it is when a line is written, not when logging was configured.

    A logger bound to the stream of its configuration writes into that stream for good: a
    stream swapped in around it (`contextlib.redirect_stderr`, a test's captured output)
    and closed since made every log call raise "I/O operation on closed file", and the
    call that logged (a send, a turn) failed with it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str = "INFO", fmt: str = "json", secrets: Iterable[str] = ()) -> None:
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            add_trace_ids,  # trace_id/span_id of the active span (app.tracing)
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            redact_values(secrets),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=_Stderr()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )
