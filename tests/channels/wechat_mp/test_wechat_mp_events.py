"""Official Account follows and unfollows end to end (docs/events.md): `subscribe` is a
`joined` event answered with `WECHAT_MP_WELCOME_TEXT` through the customer-service API,
`unsubscribe` a `left` event that says nothing; redeliveries are stored once. Callbacks are
signed (and, in safe mode, encrypted) by the test's own WeChat; the real app runs against
the fake WeChat API."""

from __future__ import annotations

import time

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import select

from app.db.models import inbox
from tests.channels.support import wait_inbox_done
from tests.channels.wechat_mp.test_wechat_mp import _post, api, mp_settings, wechat
from tests.conftest import ServeApp
from tests.fakes.wechat_mp import FakeWeChatMpApi, WeChatMpCallbacks

__all__ = ["api", "wechat"]  # the fixtures, shared with test_wechat_mp


async def test_a_follow_is_welcomed_once_and_an_unfollow_says_nothing(
    serve: ServeApp, api: FakeWeChatMpApi, wechat: WeChatMpCallbacks
) -> None:
    now = int(time.time())
    settings = mp_settings(api, safe=True, welcome_text="欢迎 {name}!")
    follow = wechat.event("openid-1", "subscribe", now, event_key="qrscene_42")
    async with (
        serve(channel_settings={"wechat-mp": settings}) as srv,
        httpx.AsyncClient(timeout=30) as client,
    ):
        for _ in range(2):  # WeChat retries the event (same OpenID and CreateTime)
            resp = await _post(client, srv.url, wechat.encrypted(follow))
            assert (resp.status_code, resp.text) == (200, "success")
        [welcome] = await api.wait_for_sent(1)
        unfollow = wechat.event("openid-1", "unsubscribe", now + 5)
        assert (await _post(client, srv.url, wechat.encrypted(unfollow))).status_code == 200
        # A later message is the barrier: a second welcome or a farewell would be sent before it.
        await _post(client, srv.url, wechat.encrypted(wechat.text("openid-1", "still here?", 501)))
        sent = await api.wait_for_sent(2)
        await wait_inbox_done(srv.runtime)
        async with srv.runtime.engine.connect() as conn:
            rows = (await conn.execute(select(inbox.c.external_id).order_by(inbox.c.id))).scalars().all()
    assert welcome.path == "/cgi-bin/message/custom/send"
    assert welcome.body == {"touser": "openid-1", "msgtype": "text", "text": {"content": "欢迎 openid-1!"}}
    assert [c.body["text"]["content"] for c in sent] == ["欢迎 openid-1!", "You said: still here?"]
    assert len(rows) == 3  # the follow once, the unfollow, the message
    assert rows[0].endswith(":subscribe") and rows[1].endswith(":unsubscribe")


def test_a_farewell_text_is_refused_it_could_never_be_delivered() -> None:
    with pytest.raises(ValidationError, match="43004"):
        mp_settings(FakeWeChatMpApi(app_id="x"), farewell_text="bye {name}")
