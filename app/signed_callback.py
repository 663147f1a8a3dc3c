"""Signed HTTP callbacks: chatgate POSTs to a URL its caller gave, signed so it can verify.

The generic webhook's replies (`WEBHOOK_CALLBACK_URL`) and A2A push notifications are
both sent this way, each through the outbox (retries with backoff, durable):
`X-Chatgate-Timestamp: <unix seconds>` and `X-Chatgate-Signature: sha256=<hex
HMAC-SHA256(secret, "{timestamp}.{raw body}")>`, the same rule the webhook channel
checks on what it receives. The receiver's answer is turned into the outbox's error
tree: 429 and 5xx (and an unreachable receiver) are retried, other 4xx are not.

A URL the operator configured (`WEBHOOK_CALLBACK_URL`) is posted to with the plain
client; a URL a caller gave (an A2A push config) goes through the guarded fetcher
(`app.fetch`), and one it refuses (a private address) is rejected, not retried.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping

import httpx

from app.errors import ChannelRateLimited, ChannelRejected, ChannelUnavailable
from app.fetch import FetchRefused, GuardedFetcher

SIGNATURE_HEADER = "x-chatgate-signature"
TIMESTAMP_HEADER = "x-chatgate-timestamp"


def sign(secret: str, timestamp: int | str, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return "sha256=" + mac.hexdigest()


def signed_headers(secret: str, body: bytes, *, now: float | None = None) -> dict[str, str]:
    ts = str(int(time.time() if now is None else now))
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: sign(secret, ts, body)}


async def post_signed(
    http: httpx.AsyncClient | GuardedFetcher,
    url: str,
    body: bytes,
    *,
    secret: str,
    headers: Mapping[str, str] | None = None,
    what: str = "callback",
    allow_private: bool = False,
) -> httpx.Response:
    """POST `body` (JSON) signed with `secret`; raise the outbox's delivery errors on failure.

    `http`: the plain client for an operator's URL, the guarded fetcher for a caller's
    (`allow_private`: the operator allowed private addresses for these)."""
    sent = {"Content-Type": "application/json", **(headers or {}), **signed_headers(secret, body)}
    try:
        if isinstance(http, GuardedFetcher):
            answer = await http.post(url, content=body, headers=sent, allow_private=allow_private)
            resp = answer.as_response("POST")
        else:
            resp = await http.post(url, content=body, headers=sent)
    except FetchRefused as exc:
        raise ChannelRejected(f"{what} refused: {exc}") from exc
    except httpx.HTTPError as exc:
        raise ChannelUnavailable(f"{what} unreachable: {exc!r}") from exc
    if resp.status_code == 429:
        raise ChannelRateLimited(_retry_after(resp), f"{what} answered 429")
    if resp.status_code >= 500 or resp.status_code == 408:
        raise ChannelUnavailable(f"{what} answered {resp.status_code}")
    if resp.status_code >= 400:
        raise ChannelRejected(f"{what} answered {resp.status_code}: {resp.text[:200]}")
    return resp


def _retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
