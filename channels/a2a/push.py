"""A2A push notifications: a caller's push configs, and a POST to it on each task state change.

`tasks/pushNotificationConfig/set` (or a config given with `message/send`) stores the
config as one of the channel's records (`ChannelContext.records`, kind "push", key
`<task id>/<config id>`, owned by the caller). Every replica's notifier looks at the
configs of unfinished tasks every `A2A_PUSH_POLL_SECONDS`; when a task's state is not
the one last notified, it hands a notification to the outbox (`records.deliver`). The
outbox row's id is derived from the config and the state, so replicas noticing the same
change at once send it once. The sender then calls the channel's `send`, which POSTs
the notification: a `StreamResponse` with a `statusUpdate` (as the SDK's own sender
does), the config's token in `X-A2A-Notification-Token`, its authentication in
`Authorization`, signed like the webhook's callbacks (`app.signed_callback`), and
retried with backoff by the outbox when the receiver is down.

A state that lasts less than a poll interval may be passed over; `submitted` (sent when
the config is stored with the message) and the final state are always sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import Any

import structlog
from a2a.server.tasks.push_notification_config_store import normalize_push_notification_config
from a2a.types.a2a_pb2 import TaskPushNotificationConfig, TaskStatusUpdateEvent
from a2a.utils.errors import InvalidParamsError, PushNotificationNotSupportedError
from a2a.utils.proto_utils import to_stream_response
from google.protobuf.json_format import MessageToDict, ParseDict

from app.channel import ChannelContext, ChannelRecord, RecordStore
from app.events import OutboundMessage
from app.fetch import FetchError
from app.signed_callback import post_signed
from channels.a2a.settings import A2ASettings
from channels.a2a.tasks import TERMINAL

log = structlog.get_logger(__name__)

KIND = "push"
_MAX_ID = 200
_MAX_URL = 2000


def record_key(task_id: str, config_id: str) -> str:
    return f"{task_id}/{config_id}"


def notification_id(key: str, state: int) -> str:
    """The outbox message id of the notification of `state` to the config `key` (≤ 64 chars)."""
    return "a2apush-" + hashlib.sha256(f"{key}\n{state}".encode()).hexdigest()[:48]


def config_of(record: ChannelRecord) -> TaskPushNotificationConfig:
    return ParseDict(record.data["config"], TaskPushNotificationConfig())


class PushNotifications:
    def __init__(self, settings: A2ASettings, context: ChannelContext, channel: str) -> None:
        self.settings = settings
        self.context = context
        self.channel = channel
        self._loop: asyncio.Task[None] | None = None

    @property
    def offered(self) -> bool:
        return bool(self.settings.push_secret) and self.context.records is not None

    @property
    def records(self) -> RecordStore:
        if not self.offered or self.context.records is None:
            raise PushNotificationNotSupportedError(message="push notifications are not enabled here")
        return self.context.records

    # --- configs ----------------------------------------------------------------------

    async def check(self, config: TaskPushNotificationConfig) -> None:
        """Refuse a config that cannot be stored (before anything else is)."""
        _ = self.records
        if not config.url or len(config.url) > _MAX_URL:
            raise InvalidParamsError(message=f"a push config needs a url of at most {_MAX_URL} characters")
        if len(config.id) > _MAX_ID:
            raise InvalidParamsError(message=f"a push config id is at most {_MAX_ID} characters")
        if not config.url.startswith(("http://", "https://")):
            raise InvalidParamsError(message="the push url must be http(s) on a public address")
        if not self.settings.push_allow_private_urls:
            try:  # judged again (and pinned) at every send: this is the early answer
                await self.context.fetcher.check(config.url)
            except FetchError as exc:
                raise InvalidParamsError(message="the push url must be http(s) on a public address") from exc

    async def store(
        self,
        task_id: str,
        caller: str,
        config: TaskPushNotificationConfig,
        first: TaskStatusUpdateEvent | None = None,
    ) -> TaskPushNotificationConfig:
        """Store (or replace) the caller's config for the task. `first`: a state to notify
        before the notifier watches the config (`submitted`, for a config sent with the
        message); otherwise the notifier sends the task's current state first."""
        await self.check(config)
        records = self.records
        config = normalize_push_notification_config(task_id, config)
        config.tenant = ""
        key = record_key(task_id, config.id)
        existing = await records.with_prefix(KIND, record_key(task_id, ""))
        if key not in {r.key for r in existing} and len(existing) >= self.settings.push_max_configs_per_task:
            raise InvalidParamsError(
                message=f"a task has at most {self.settings.push_max_configs_per_task} push configs"
            )
        data = {"config": MessageToDict(config), "task_id": task_id, "notified": None}
        # Stored before anything is sent with it (the sender reads it), watched only once
        # `first` is in the outbox, so that nothing overtakes it.
        await records.put(KIND, key, data, owner=caller, open=first is None)
        if first is not None:
            await self.notify(ChannelRecord(key=key, owner=caller, data=data, open=False), first)
        return config

    async def get(self, task_id: str, config_id: str, caller: str) -> TaskPushNotificationConfig | None:
        record = await self.records.get(KIND, record_key(task_id, config_id or task_id))
        if record is None or record.owner != caller:
            return None
        return config_of(record)

    async def list(self, task_id: str, caller: str) -> list[TaskPushNotificationConfig]:
        found = await self.records.with_prefix(KIND, record_key(task_id, ""))
        return [config_of(r) for r in found if r.owner == caller]

    async def remove(self, task_id: str, config_id: str, caller: str) -> bool:
        key = record_key(task_id, config_id or task_id)
        record = await self.records.get(KIND, key)
        if record is None or record.owner != caller:
            return False
        return await self.records.remove(KIND, key)

    # --- noticing changes -------------------------------------------------------------

    async def notify(self, record: ChannelRecord, event: TaskStatusUpdateEvent) -> None:
        """Hand the notification of `event` for `record`'s config to the outbox."""
        records = self.records
        state = event.status.state
        body = MessageToDict(to_stream_response(event))
        await records.deliver(
            [
                OutboundMessage(
                    message_id=notification_id(record.key, state),
                    channel=self.channel,
                    chat_id=record.owner or "",
                    session_key=f"a2a-push:{record.key}",  # in order per config, apart from others
                    metadata={"a2a_push": {"config": record.key, "body": body}},
                )
            ]
        )
        data = {**record.data, "notified": state}
        await records.put(KIND, record.key, data, owner=record.owner, open=state not in TERMINAL)

    async def start(self, read_status: Any) -> None:
        """Watch the open configs (`read_status(task_id, caller)` → TaskStatusUpdateEvent | None)."""
        if self.offered:
            self._loop = asyncio.create_task(self._watch(read_status), name="a2a-push")

    async def stop(self) -> None:
        if self._loop is not None:
            self._loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop
            self._loop = None

    async def _watch(self, read_status: Any) -> None:
        while True:
            try:
                await self.check_states(read_status)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("a2a_push_check_failed")
            await asyncio.sleep(self.settings.push_poll_seconds)

    async def check_states(self, read_status: Any) -> None:
        for record in await self.records.open_records(KIND):
            event = await read_status(record.data.get("task_id", ""), record.owner or "")
            if event is None:  # the task is gone (retention): nothing more to tell
                await self.records.put(KIND, record.key, record.data, owner=record.owner, open=False)
                continue
            if event.status.state != record.data.get("notified"):
                await self.notify(record, event)

    # --- sending (called by the outbox sender through the channel's `send`) -----------

    async def send(self, message: OutboundMessage) -> None:
        push = message.metadata["a2a_push"]
        record = await self.records.get(KIND, str(push["config"]))
        if record is None:
            return  # the config was deleted: nothing to tell
        config = config_of(record)
        headers: dict[str, str] = {}
        if config.token:
            headers["X-A2A-Notification-Token"] = config.token
        auth = config.authentication
        if config.HasField("authentication") and auth.scheme and auth.credentials:
            headers["Authorization"] = f"{auth.scheme} {auth.credentials}"
        raw = json.dumps(push["body"], ensure_ascii=False).encode()
        assert self.settings.push_secret is not None
        await post_signed(
            self.context.fetcher,  # the URL is the caller's: no private address, no rebinding
            config.url,
            raw,
            secret=self.settings.push_secret,
            headers={**headers, "Idempotency-Key": message.message_id},
            what="push notification receiver",
            allow_private=self.settings.push_allow_private_urls,
        )
