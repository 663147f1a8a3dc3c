"""Helpers of the Feishu tests: settings pointing at the fake, posting callbacks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from channels.feishu import FeishuSettings
from tests.app.agent.test_agent_e2e import openai_settings
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI
from tests.support.servers import RunningApp

# lark-oapi takes ~3 CPU-s to import (it loads every API's models): the tests that check us
# against it import it themselves and share one worker, instead of every worker paying for
# it while collecting.
LARK_OAPI = pytest.mark.xdist_group("lark-oapi")


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


@asynccontextmanager
async def served_with_tools(
    serve: ServeApp, fake: FakeFeishu, model: FakeOpenAI, workspace: Path, **settings: Any
) -> AsyncIterator[tuple[RunningApp, httpx.AsyncClient]]:
    """The app serving Feishu (`fake`, with `settings`) and the model, whose file tools write
    in `workspace`; a client to post callbacks with."""
    async with (
        serve(
            channel_settings={"feishu": feishu_settings(fake, **settings)},
            **openai_settings(model, workspace_root=str(workspace)),
        ) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        yield srv, client
