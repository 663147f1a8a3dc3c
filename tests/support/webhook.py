"""A client of the generic webhook, signing from the published rule (not the adapter's code)."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import httpx


def signed_headers(secret: str, body: bytes, *, timestamp: int | None = None) -> dict[str, str]:
    ts = str(int(time.time()) if timestamp is None else timestamp)
    mac = hmac.new(secret.encode(), ts.encode() + b"." + body, hashlib.sha256).hexdigest()
    return {
        "Content-Type": "application/json",
        "X-Chatgate-Timestamp": ts,
        "X-Chatgate-Signature": f"sha256={mac}",
    }


async def post_webhook(
    client: httpx.AsyncClient,
    base_url: str,
    secret: str,
    payload: dict[str, Any],
    *,
    wait: bool = False,
    headers: dict[str, str] | None = None,
    timeout: float | None = None,
) -> httpx.Response:
    body = json.dumps(payload).encode()
    params: dict[str, str] = {}
    if wait:
        params["wait"] = "true"
        if timeout is not None:
            params["timeout"] = str(timeout)
    return await client.post(
        f"{base_url}/channels/webhook",
        content=body,
        params=params,
        headers={**signed_headers(secret, body), **(headers or {})},
    )
