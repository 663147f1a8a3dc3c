"""A2A push notifications: configs set with the official `a2a-sdk` client, notifications
received by a real local HTTP server, signed by the webhook rule, retried through an outage."""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    SendMessageConfiguration,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.utils.errors import InvalidParamsError, PushNotificationNotSupportedError, TaskNotFoundError
from sqlalchemy import select

from app.db.models import inbox, outbox
from tests.channels.a2a.test_a2a import (
    TOKEN_A,
    TOKEN_B,
    channels,
    only_task,
    sdk_client,
    user_message,
    wait_state,
)
from tests.channels.support import count
from tests.conftest import ServeApp
from tests.fakes.http_receiver import HttpReceiver, Received

SECRET = "push-signing-secret-0123456789"


def push_channels(**overrides: Any) -> dict[str, Any]:
    return channels(push_secret=SECRET, push_allow_private_urls=True, push_poll_seconds=0.05, **overrides)


def verified(received: Received) -> dict[str, Any]:
    """The body, once its signature is checked by the published webhook rule."""
    ts = received.headers["x-chatgate-timestamp"]
    expected = (
        "sha256=" + hmac.new(SECRET.encode(), f"{ts}.".encode() + received.body, hashlib.sha256).hexdigest()
    )
    assert hmac.compare_digest(received.headers["x-chatgate-signature"], expected)
    body: dict[str, Any] = json.loads(received.body)
    return body


def states(received: list[Received]) -> list[str]:
    return [verified(r)["statusUpdate"]["status"]["state"] for r in received]


async def test_state_changes_are_pushed_signed_with_the_config_token_and_retried(serve: ServeApp) -> None:
    async with HttpReceiver(fail_first=2) as receiver:
        config = TaskPushNotificationConfig(
            url=receiver.url,
            token="caller-check-token",
            authentication=AuthenticationInfo(scheme="Bearer", credentials="receiver-credential"),
        )
        async with (
            serve(
                channel_settings=push_channels(),
                offline_latency_ms=800,
                outbox_poll_seconds=0.05,
                outbox_backoff_base_seconds=0.05,
            ) as srv,
            sdk_client(srv.url, TOKEN_A) as client,
        ):
            async with httpx.AsyncClient(timeout=30) as http:
                card = await A2ACardResolver(http, srv.url).get_agent_card()
            assert card.capabilities.push_notifications
            request = SendMessageRequest(
                message=user_message("notify me", "p"),
                configuration=SendMessageConfiguration(
                    return_immediately=True, task_push_notification_config=config
                ),
            )
            [response] = [e async for e in client.send_message(request)]
            task = response.task
            await wait_state(client, task.id, {TaskState.TASK_STATE_COMPLETED})
            received = await receiver.wait_for(3)
            stored = await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id=task.id)
            )
            assert stored.url == receiver.url and stored.token == "caller-check-token"
            async with srv.runtime.engine.connect() as conn:
                rows = (
                    await conn.execute(select(outbox.c.status, outbox.c.attempts, outbox.c.event_id))
                ).all()
        assert states(received) == ["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
        assert receiver.attempts == 5  # the receiver was down for two attempts: both retried
        first = received[0]
        assert first.headers["x-a2a-notification-token"] == "caller-check-token"
        assert first.headers["authorization"] == "Bearer receiver-credential"
        update = verified(received[-1])["statusUpdate"]
        assert update["taskId"] == task.id and update["contextId"] == "p"
        assert update["status"]["message"]["parts"][0]["text"] == "You said: notify me"
        pushed = [r for r in rows if r.event_id is None]
        assert [r.status for r in pushed] == ["sent"] * 3
        assert pushed[0].attempts == 3  # retried through the outbox until the receiver answered


async def test_configs_are_set_listed_and_deleted_per_caller(serve: ServeApp) -> None:
    async with (
        HttpReceiver() as receiver,
        serve(channel_settings=push_channels()) as srv,
        sdk_client(srv.url, TOKEN_A) as one,
        sdk_client(srv.url, TOKEN_B) as two,
    ):
        task = await only_task(one, user_message("hello", "c"))
        made = await one.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task.id, id="mine", url=receiver.url, token="t")
        )
        assert made.id == "mine" and made.task_id == task.id
        listed = await one.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task.id)
        )
        assert [c.id for c in listed.configs] == ["mine"]
        # Set on a finished task: its final state is sent once.
        [done] = await receiver.wait_for(1)
        assert states([done]) == ["TASK_STATE_COMPLETED"]
        with pytest.raises(TaskNotFoundError):  # another caller's task is unknown to it
            await two.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, url=receiver.url)
            )
        with pytest.raises(TaskNotFoundError):
            await two.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id="mine")
            )
        with pytest.raises(InvalidParamsError, match="http"):
            await one.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task.id, url="file:///etc/passwd")
            )
        await one.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="mine")
        )
        with pytest.raises(TaskNotFoundError):
            await one.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task.id, id="mine")
            )
        assert len(receiver.received) == 1


async def test_a_private_url_or_no_secret_is_refused_and_the_message_not_stored(serve: ServeApp) -> None:
    config = TaskPushNotificationConfig(url="http://127.0.0.1:9/hook")
    request = SendMessageRequest(
        message=user_message("hi", "c"),
        configuration=SendMessageConfiguration(task_push_notification_config=config),
    )
    async with (
        serve(channel_settings=channels(push_secret=SECRET)) as srv,
        sdk_client(srv.url, TOKEN_A) as client,
    ):
        with pytest.raises(InvalidParamsError, match="public"):
            [_ async for _ in client.send_message(request)]
        assert await count(srv.runtime, inbox) == 0
    async with serve(channel_settings=channels()) as srv, sdk_client(srv.url, TOKEN_A) as client:
        with pytest.raises(PushNotificationNotSupportedError):
            [_ async for _ in client.send_message(request)]
        assert await count(srv.runtime, inbox) == 0
