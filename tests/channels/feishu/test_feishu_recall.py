"""Feishu `im.message.recalled_v1` end to end (docs/events.md): our answer to the recalled
message is recalled too (`DELETE /open-apis/im/v1/messages/{id}`) and the model no longer
sees the exchange. The real app, a fake Feishu Open Platform, the fake OpenAI server."""

from __future__ import annotations

from typing import Any

import httpx

from tests.app.agent.test_agent_e2e import openai_settings
from tests.channels.feishu.support import feishu_settings, post_callback
from tests.channels.support import wait_inbox_done
from tests.conftest import ServeApp
from tests.fakes import feishu as fs
from tests.fakes.feishu import FakeFeishu
from tests.fakes.openai_server import FakeOpenAI, Reply


def echo(body: dict[str, Any]) -> Reply:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    return Reply(content=f"echo {user}")


async def test_a_recall_recalls_our_answer_and_hides_the_exchange_from_the_model(serve: ServeApp) -> None:
    async with FakeOpenAI(default=echo) as model, FakeFeishu() as fake:
        channel = {"feishu": feishu_settings(fake, streaming="off")}
        async with (
            serve(channel_settings=channel, **openai_settings(model)) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_callback(
                client, srv.url, fs.text_event("my card number is 4111", message_id="om_secret")
            )
            [answer] = await fake.wait_for(1, "create")
            assert answer.text == "echo my card number is 4111"
            await wait_inbox_done(srv.runtime)
            resp = await post_callback(client, srv.url, fs.recall_event("om_secret"))
            assert resp.status_code == 200, resp.text
            [recall] = await fake.wait_for(1, "recall")
            await post_callback(client, srv.url, fs.text_event("what is my card number?"))
            await fake.wait_for(2, "create")
    assert recall.path.endswith("/om_sent0001") and recall.ok
    assert "4111" in str(model.requests[0].messages)
    assert "4111" not in str(model.requests[1].messages)
