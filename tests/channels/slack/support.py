"""Helpers of the Slack tests: settings pointing at the fake, posting signed events."""

from __future__ import annotations

import json
from typing import Any

import httpx

from channels.slack import SlackSettings
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack


def slack_settings(fake: FakeSlack, **overrides: Any) -> SlackSettings:
    values: dict[str, Any] = dict(
        bot_token=fake.token,
        signing_secret=sl.SIGNING_SECRET,
        api_base_url=fake.url,
    )
    values.update(overrides)
    return SlackSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_event(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """POST an Events API payload, signed with Slack's rule."""
    body = json.dumps(payload).encode()
    return await client.post(
        f"{base_url}/channels/slack/events",
        content=body,
        headers={**sl.signed_headers(body), **(headers or {})},
    )
