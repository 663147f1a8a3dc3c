"""Live credential checks of `chatgate doctor`: one small request per platform.

Each channel package that holds platform credentials exposes `probe(settings, client)`
in its `probe.py`: it makes the cheapest authenticated call the platform offers (Telegram
`getMe`, Slack `auth.test`, …) and returns what it learnt (the bot's name), or raises
`CredentialsRejected` with the platform's reason. A secret is never part of a message.
"""

from __future__ import annotations

from typing import Any

import httpx


class CredentialsRejected(Exception):
    """The platform answered, and refused the configured credentials (or was unreachable)."""


def answer_json(response: httpx.Response, what: str) -> dict[str, Any]:
    """The JSON body of a platform's answer, or `CredentialsRejected` naming the status."""
    try:
        data = response.json()
    except ValueError:
        raise CredentialsRejected(f"{what} answered {response.status_code} without JSON") from None
    if not isinstance(data, dict):
        raise CredentialsRejected(f"{what} answered {response.status_code} with unexpected JSON")
    return data


def unreachable(what: str, exc: httpx.HTTPError) -> CredentialsRejected:
    return CredentialsRejected(f"{what} not answering: {type(exc).__name__}")


async def request(
    client: httpx.AsyncClient, what: str, method: str, url: str, **kwargs: Any
) -> httpx.Response:
    """The platform's answer to one request; not answering is `CredentialsRejected`
    naming `what` (never the URL, which may carry the token)."""
    try:
        return await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        raise unreachable(what, exc) from None
