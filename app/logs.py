"""structlog set-up: JSON lines, context bound per event, secrets redacted."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import MutableMapping
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


def configure_logging(level: str = "INFO", fmt: str = "json") -> None:
    renderer: Any = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            add_trace_ids,  # trace_id/span_id of the active span (app.tracing)
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
