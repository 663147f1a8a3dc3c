"""A QR login run in the background for the dashboard (`/admin/api/channels/weixin/login`)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import structlog

from app.channel import RecordStore
from app.errors import ChannelRequestError
from channels.weixin import login
from channels.weixin.api import Identity, ILinkClient
from channels.weixin.settings import WeixinSettings

log = structlog.get_logger(__name__)


class BackgroundLogin:
    """At most one login at a time on this replica; its progress stays readable after it ends."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        settings: WeixinSettings,
        identity: Identity,
        records: RecordStore | None,
    ) -> None:
        self.http = http
        self.settings = settings
        self.identity = identity
        self.records = records
        self.progress: login.LoginProgress | None = None
        self._task: asyncio.Task[Any] | None = None

    def start(self) -> login.LoginProgress:
        """Begin a QR login (or return the one running); its progress."""
        if self._task is not None and not self._task.done() and self.progress is not None:
            return self.progress
        if self.records is None:
            raise ChannelRequestError("logins are stored in the database, which this runtime has not")
        progress = self.progress = login.LoginProgress()
        client = ILinkClient(
            self.http,
            self.settings.api_base_url,
            None,
            self.identity,
            timeout=self.settings.request_timeout_seconds,
        )
        self._task = asyncio.create_task(
            login.run_login(
                client,
                self.records,
                account=self.settings.account,
                bot_type=self.settings.bot_type,
                timeout=self.settings.login_timeout_seconds,
                progress=progress,
            ),
            name="weixin-login",
        )
        self._task.add_done_callback(lambda t: _ended(t, progress))
        return progress

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None


def _ended(task: asyncio.Task[Any], progress: login.LoginProgress) -> None:
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        progress.done, progress.status, progress.message = True, "failed", f"login failed: {exc!r}"
        progress.shown.set()
        log.warning("weixin_login_failed", error=repr(exc))
