"""Sending: outages retried then recorded as failed, tokens refreshed, refusals not retried."""

from __future__ import annotations

import httpx

from tests.channels.dingtalk.support import dingtalk_settings, post_message
from tests.channels.support import wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes import dingtalk as dt
from tests.fakes.dingtalk import FakeDingTalk


async def test_outage_on_send_is_retried_then_recorded_as_failed(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.always[dt.SINGLE_SEND] = dt.SERVER_ERROR
        fake.always[dt.WEBHOOK_PATH] = dt.SERVER_ERROR
        async with (
            serve(
                channel_settings={"dingtalk": dingtalk_settings(fake)},
                outbox_max_attempts=3,
                outbox_backoff_base_seconds=0.05,
            ) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_message(client, srv.url, dt.robot_message("anyone?", webhook=fake.webhook_url))
            [row] = await wait_outbox_final(srv.runtime)
    assert row["status"] == "failed"
    assert row["attempts"] == 3
    assert "500" in row["last_error"]
    # Each attempt tried the session webhook, then the robot API.
    assert len(fake.calls_of(dt.WEBHOOK_PATH)) == 3
    assert len(fake.calls_of(dt.SINGLE_SEND)) == 3


async def test_revoked_token_is_renewed_and_refusals_are_not_retried(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.fail(dt.SINGLE_SEND, dt.Failure(401, "InvalidAuthentication", "token expired"))
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            await post_message(client, srv.url, dt.robot_message("renew"))
            [row] = await wait_outbox_final(srv.runtime)
            assert (row["status"], row["attempts"]) == ("sent", 1)
            fake.fail(dt.GROUP_SEND, dt.NO_PERMISSION)
            await post_message(client, srv.url, dt.robot_message("forbidden", group=True))
            rows = await wait_outbox_final(srv.runtime, 2)
    assert len(fake.calls_of(dt.TOKEN_PATH)) == 2
    assert [c.headers["x-acs-dingtalk-access-token"] for c in fake.calls_of(dt.SINGLE_SEND)] == [
        "token-1",
        "token-2",
    ]
    refused = rows[1]
    assert (refused["status"], refused["attempts"]) == ("failed", 1)
    assert "403" in refused["last_error"]


async def test_people_outside_the_organisation_are_answered_only_by_session_webhook(serve: ServeApp) -> None:
    async with FakeDingTalk() as fake:
        fake.fail(dt.WEBHOOK_PATH, dt.SERVER_ERROR)  # down once, then up
        async with (
            serve(channel_settings={"dingtalk": dingtalk_settings(fake)}) as srv,
            httpx.AsyncClient(timeout=30) as client,
        ):
            guest = dt.robot_message("from outside", webhook=fake.webhook_url)
            del guest["senderStaffId"]
            await post_message(client, srv.url, guest)
            [row] = await wait_outbox_final(srv.runtime)
            assert (row["status"], row["attempts"]) == ("sent", 2)
            late = dt.robot_message("too late", webhook=fake.webhook_url, webhook_expires_ms=1_000)
            del late["senderStaffId"]
            await post_message(client, srv.url, late)
            rows = await wait_outbox_final(srv.runtime, 2)
    assert (rows[1]["status"], rows[1]["attempts"]) == ("failed", 1)
    assert "no valid session webhook" in rows[1]["last_error"]
    assert fake.calls_of(dt.SINGLE_SEND) == []  # the robot API cannot reach them: never tried
    assert [c.body["text"]["content"] for c in fake.delivered()] == ["You said: from outside"]
