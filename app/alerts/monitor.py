"""Alerts that arrive once: incidents the gateway detects itself, announced to the
operators' chat (through the outbox, like every reply) and/or a signed webhook — one
notice when an incident opens, one when it is over, whichever replica saw it first.

Every replica checks every ALERT_CHECK_SECONDS. An incident's row in `alert_incidents`
moves between `open` and `resolved` by one conditional statement; only the replica whose
statement moved it sends the notice. The database itself being unreachable cannot be
agreed on through the database: each replica that cannot reach it says so once on the
webhook (the outbox is in the database too), and once more when it is back.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime

import httpx
import structlog
from sqlalchemy import insert, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.alerts.detect import Reading, conflict_readings, memory_reading, shared_readings
from app.alerts.settings import AlertSettings
from app.alerts.texts import alert_text
from app.channel import ConnectionConflicts
from app.db.models import alert_incidents, outbox, utcnow
from app.events import OutboundMessage, TextPart
from app.outbox_rows import outbox_values

log = structlog.get_logger(__name__)

ALERTS_KEY = "%alerts"  # the outbox's session key of alert messages (no conversation)
WEBHOOK_ATTEMPTS = 3


class Incidents:
    """The shared state of incidents: `open` and `resolve` answer whether this call
    changed it (then, and only then, the caller announces it)."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.engine = engine

    async def open(self, reading: Reading, now: datetime) -> bool:
        table = alert_incidents
        values = dict(state="open", detail=reading.detail, opened_at=now, resolved_at=None, updated_at=now)
        async with self.engine.begin() as conn:
            reopened = await conn.execute(
                update(table)
                .where(table.c.name == reading.name, table.c.state == "resolved")
                .values(**values)
            )
            if reopened.rowcount:
                return True
        try:
            async with self.engine.begin() as conn:
                await conn.execute(insert(table).values(name=reading.name, **values))
        except IntegrityError:
            return False  # open already (here or on another replica)
        return True

    async def resolve(self, name: str, now: datetime) -> bool:
        table = alert_incidents
        async with self.engine.begin() as conn:
            done = await conn.execute(
                update(table)
                .where(table.c.name == name, table.c.state == "open")
                .values(state="resolved", resolved_at=now, updated_at=now)
            )
        return bool(done.rowcount)


class AlertNotifier:
    def __init__(
        self,
        settings: AlertSettings,
        engine: AsyncEngine,
        http: httpx.AsyncClient,
        *,
        on_outbox: Callable[[], None] = lambda: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.http = http
        self.on_outbox = on_outbox
        self._sleep = sleep

    async def send(self, reading: Reading, *, resolved: bool, through_outbox: bool = True) -> None:
        text = alert_text(self.settings.language, reading.kind, reading.detail, resolved=resolved)
        if through_outbox and self.settings.channel and self.settings.chat_id:
            await self._to_chat(text)
        if self.settings.webhook_url:
            await self._to_webhook(reading, text, resolved=resolved)
        log.warning(
            "alert_resolved" if resolved else "alert_firing", incident=reading.name, detail=reading.detail
        )

    async def _to_chat(self, text: str) -> None:
        assert self.settings.channel and self.settings.chat_id
        message = OutboundMessage(
            channel=self.settings.channel,
            chat_id=self.settings.chat_id,
            parts=(TextPart(text=text),),
            session_key=ALERTS_KEY,
        )
        async with self.engine.begin() as conn:
            await conn.execute(
                outbox.insert(), outbox_values(message, session_id=None, run_id=None, event_id=None)
            )
        self.on_outbox()

    async def _to_webhook(self, reading: Reading, text: str, *, resolved: bool) -> None:
        assert self.settings.webhook_url
        body = json.dumps(
            {
                "incident": reading.name,
                "kind": reading.kind,
                "state": "resolved" if resolved else "firing",
                "detail": reading.detail,
                "text": text,
                "at": utcnow().isoformat(),
            },
            ensure_ascii=False,
        ).encode()
        headers = {"Content-Type": "application/json"}
        if self.settings.webhook_secret:
            ts = str(int(time.time()))
            mac = hmac.new(self.settings.webhook_secret.encode(), f"{ts}.".encode() + body, hashlib.sha256)
            headers |= {"X-Chatgate-Timestamp": ts, "X-Chatgate-Signature": f"sha256={mac.hexdigest()}"}
        for attempt in range(WEBHOOK_ATTEMPTS):
            try:
                response = await self.http.post(self.settings.webhook_url, content=body, headers=headers)
                if response.status_code < 500:
                    return
            except httpx.HTTPError as exc:
                log.warning("alert_webhook_failed", error=type(exc).__name__, attempt=attempt + 1)
            await self._sleep(2**attempt)


class AlertMonitor:
    def __init__(
        self,
        settings: AlertSettings,
        engine: AsyncEngine,
        notifier: AlertNotifier,
        *,
        served: set[str],
        owner: str,
        conflicts: Callable[[], Mapping[str, ConnectionConflicts]] = dict,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        """`conflicts`: the channels whose connection this replica runs, each with how the
        platform answers it (`ReportsConflicts`)."""
        self.settings = settings
        self.engine = engine
        self.notifier = notifier
        self.incidents = Incidents(engine)
        self.served = served
        self.owner = owner
        self.conflicts = conflicts
        self.clock = clock
        self._database_down: Reading | None = None
        self._task: asyncio.Task[None] | None = None

    async def check_once(self) -> None:
        now = self.clock()
        try:
            readings = await shared_readings(self.engine, self.settings, served=self.served, now=now)
        except (OSError, SQLAlchemyError) as exc:
            if self._database_down is None:
                detail = (
                    f"replica {self.owner}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
                )
                self._database_down = Reading(f"database:{self.owner}", "database", True, detail)
                await self.notifier.send(self._database_down, resolved=False, through_outbox=False)
            return
        if self._database_down is not None:
            back, self._database_down = self._database_down, None
            await self.notifier.send(back, resolved=True)
        memory = memory_reading(self.settings, self.owner)
        conflicts = conflict_readings(self.settings, self.conflicts())
        for reading in [*readings, *conflicts, *([memory] if memory else [])]:
            if reading.firing:
                if await self.incidents.open(reading, now):
                    await self.notifier.send(reading, resolved=False)
            elif await self.incidents.resolve(reading.name, now):
                await self.notifier.send(reading, resolved=True)

    async def _run(self) -> None:
        while True:
            try:
                await self.check_once()
            except Exception:  # an alert that cannot be sent must not stop the watching
                log.exception("alert_check_failed")
            await asyncio.sleep(self.settings.check_seconds)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="alerts")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
