"""Socket Mode (development): events over the WebSocket the app opens, acknowledged after the commit."""

from __future__ import annotations

import httpx

from app.db.models import inbox, outbox
from tests.channels.slack.support import post_event, slack_settings
from tests.channels.support import count, wait_inbox_done, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import slack as sl
from tests.fakes.slack import FakeSlack


async def test_socket_mode_event_is_acknowledged_answered_and_redelivery_is_processed_once(
    serve: ServeApp,
) -> None:
    async with FakeSlack() as fake:
        settings = slack_settings(fake, mode="socket", app_token=sl.APP_TOKEN, signing_secret=None)
        async with serve(channel_settings={"slack": settings}) as srv:
            await fake.wait_for_socket()
            payload = sl.event_callback(sl.dm("over the socket"))
            await fake.push_envelope(payload, "env-1")
            assert await fake.wait_for_acks(1) == ["env-1"]
            assert await count(srv.runtime, inbox) == 1  # stored before the ack was sent
            await fake.push_envelope(payload, "env-1", retry_attempt=1)
            await fake.wait_for_acks(2)
            [call] = await fake.wait_for("chat.postMessage", 1)
            await wait_outbox_final(srv.runtime)
            await wait_inbox_done(srv.runtime)
            assert await count(srv.runtime, inbox) == 1
            assert await count(srv.runtime, outbox) == 1
            # Without SLACK_SIGNING_SECRET the HTTP endpoint is refused as not configured.
            async with httpx.AsyncClient(timeout=30) as client:
                resp = await post_event(client, srv.url, payload)
                assert resp.status_code == 503
                assert "SLACK_SIGNING_SECRET" in resp.json()["detail"]
            # A bot message over the socket is acknowledged and ignored.
            await fake.push_envelope(sl.event_callback(sl.dm("bot", bot_id="BX")), "env-2")
            await fake.wait_for_acks(3)
            assert await count(srv.runtime, inbox) == 1
    assert fake.calls_of("apps.connections.open")[0].headers["authorization"] == f"Bearer {sl.APP_TOKEN}"
    assert call.params["channel"] == "D0ALICE"
    assert call.params["text"] == "You said: over the socket"
