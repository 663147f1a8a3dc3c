"""Helpers of the Feishu tests: settings pointing at the fake, posting callbacks."""

from __future__ import annotations

from typing import Any

import httpx

from channels.feishu import FeishuSettings
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu


def feishu_settings(fake: FakeFeishu, **overrides: Any) -> FeishuSettings:
    values: dict[str, Any] = dict(
        app_id=fs.APP_ID,
        app_secret=fs.APP_SECRET,
        verification_token=fs.VERIFICATION_TOKEN,
        encrypt_key=fs.ENCRYPT_KEY,
        api_base=fake.url,
    )
    values.update(overrides)
    return FeishuSettings(_env_file=None, **values)  # type: ignore[call-arg]


async def post_callback(
    client: httpx.AsyncClient, base_url: str, payload: dict[str, Any], **callback: Any
) -> httpx.Response:
    """POST an event the way Feishu does: encrypted and signed unless told otherwise."""
    body, headers = fs.callback(payload, **callback)
    return await client.post(f"{base_url}/channels/feishu", content=body, headers=headers)
