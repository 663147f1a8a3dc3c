"""Slack Web API failures as the outbox's delivery errors (`app.errors`)."""

from __future__ import annotations

from typing import Any

from slack_sdk.errors import SlackApiError

from app.errors import (
    ChannelRateLimited,
    ChannelRejected,
    ChannelSendAuthError,
    ChannelUnavailable,
    DeliveryError,
)

# Web API errors that mean our token is wrong; retrying cannot help.
_AUTH_ERRORS = {
    "invalid_auth",
    "not_authed",
    "account_inactive",
    "token_revoked",
    "token_expired",
    "no_permission",
    "missing_scope",
    "ekm_access_denied",
}
# Web API errors that are Slack's trouble, not ours: try again later.
_TRANSIENT_ERRORS = {"internal_error", "fatal_error", "service_unavailable", "request_timeout"}


def error_code(exc: SlackApiError) -> str | None:
    """The `error` of Slack's `{"ok": false, "error": …}` answer."""
    data = getattr(exc.response, "data", None)
    error = data.get("error") if isinstance(data, dict) else None
    return str(error) if error else None


def delivery_error(exc: SlackApiError) -> DeliveryError:
    response = exc.response
    status = int(getattr(response, "status_code", 0) or 0)
    error = error_code(exc)
    if status == 429 or error == "ratelimited":
        return ChannelRateLimited(_retry_after(getattr(response, "headers", None)), "Slack rate limit (429)")
    if error in _AUTH_ERRORS:
        return ChannelSendAuthError(f"Slack refused our token: {error}")
    if status >= 500 or error in _TRANSIENT_ERRORS or error is None:
        return ChannelUnavailable(f"Slack answered {status}: {error or 'no error code'}")
    return ChannelRejected(f"Slack rejected the message: {error}")


def _retry_after(headers: Any) -> float:
    value = None
    if headers:
        for key, item in dict(headers).items():
            if str(key).lower() == "retry-after":
                value = item
    try:
        return max(0.0, float(value)) if value is not None else 1.0
    except (TypeError, ValueError):
        return 1.0
