"""The typed error tree of chatgate.

Errors carry what the caller needs (`ChannelRateLimited.retry_after`); only `app.api`
turns them into HTTP responses, using `http_status` and `code`.
"""

from __future__ import annotations


class ChatgateError(Exception):
    """Base of every error chatgate raises on purpose."""


class DatabaseUnusable(Exception):
    """Connecting failed in a way waiting does not cure; the message says why (raised by
    `app.migrate`; here so that the CLI can catch it without importing SQLAlchemy)."""


# --- inbound: a request a channel refuses --------------------------------------------


class ChannelRequestError(ChatgateError):
    """A platform request that cannot be accepted; nothing is stored."""

    http_status = 400
    code = "bad_request"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class ChannelAuthError(ChannelRequestError):
    """Missing or wrong signature/token, or a stale timestamp."""

    http_status = 401
    code = "unauthorized"


class ChannelForbidden(ChannelRequestError):
    http_status = 403
    code = "forbidden"


class InvalidPayload(ChannelRequestError):
    http_status = 400
    code = "invalid_payload"


class PayloadTooLarge(ChannelRequestError):
    http_status = 413
    code = "payload_too_large"


class UnsupportedMediaType(ChannelRequestError):
    http_status = 415
    code = "unsupported_media_type"


class ChannelNotConfigured(ChannelRequestError):
    """The channel is enabled but lacks a setting it needs (a secret, a token)."""

    http_status = 503
    code = "channel_not_configured"


class UnknownChannel(ChannelRequestError):
    http_status = 404
    code = "unknown_channel"


# --- outbound: a delivery that failed ------------------------------------------------


class DeliveryError(ChatgateError):
    """Sending to a platform failed. `retryable` tells the outbox what to do."""

    retryable = True

    def __init__(self, detail: str, *, retryable: bool | None = None) -> None:
        super().__init__(detail)
        self.detail = detail
        if retryable is not None:
            self.retryable = retryable


class ChannelRateLimited(DeliveryError):
    """The platform asked us to wait `retry_after` seconds (Telegram flood control, 429)."""

    def __init__(self, retry_after: float, detail: str = "rate limited") -> None:
        super().__init__(detail, retryable=True)
        self.retry_after = retry_after


class ChannelUnavailable(DeliveryError):
    """Network error or 5xx: try again later."""


class ChannelSendAuthError(DeliveryError):
    """Our credentials were refused by the platform; retrying will not help."""

    retryable = False


class ChannelRejected(DeliveryError):
    """The platform refused this message (bad chat id, blocked bot …)."""

    retryable = False


class PreviewUnavailable(DeliveryError):
    """The platform refused a native preview here (a draft or stream the chat cannot have).

    The turn goes on without a preview; its answer is delivered as a plain message.
    """

    retryable = False


# --- core --------------------------------------------------------------------------


class LeaseLost(ChatgateError):
    """This worker no longer holds the session key's lease; it must not write."""

    def __init__(self, key: str, fence: int) -> None:
        super().__init__(f"lease on {key!r} with fence {fence} is no longer held")
        self.key = key
        self.fence = fence


class RowsCanceled(ChatgateError):
    """Inbox rows a turn's start was to count were canceled meanwhile: it wrote nothing."""

    def __init__(self, ids: frozenset[int]) -> None:
        super().__init__(f"inbox rows {sorted(ids)} were canceled before their turn started")
        self.ids = ids


class ProviderError(ChatgateError):
    """The model provider failed (after its own retries)."""

    def __init__(self, detail: str, *, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.retryable = retryable
