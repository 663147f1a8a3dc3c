"""Helpers of the DingTalk tests: settings pointing at the fake, posting signed callbacks."""

from __future__ import annotations

import json
from typing import Any

import httpx

from channels.dingtalk import DingTalkSettings
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk


def dingtalk_settings(fake: FakeDingTalk, **overrides: Any) -> DingTalkSettings:
    values: dict[str, Any] = dict(
        client_id=fake.client_id,
        client_secret=fake.client_secret,
        api_base=fake.url,
        mode="http",
    )
    values.update(overrides)
    return DingTalkSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_message(
    client: httpx.AsyncClient,
    base_url: str,
    payload: dict[str, Any],
    *,
    headers: dict[str, str] | None = None,
) -> httpx.Response:
    """POST a robot message to the HTTP callback, signed with DingTalk's rule."""
    return await client.post(
        f"{base_url}/channels/dingtalk",
        content=json.dumps(payload).encode(),
        headers=headers if headers is not None else dt.signed_headers(),
    )
