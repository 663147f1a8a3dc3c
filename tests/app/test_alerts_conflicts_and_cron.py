"""Alerts of their own, through real servers and a fake Telegram: a channel in a 409 loop
(getUpdates refused as a conflict, seen by the one replica that polls, announced once
across two replicas, recovered once) and a cron job whose result was not delivered (one
alert while its reply is a dead letter, one recovery when the retry delivers it)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import httpx
import pytest

from app.alerts import AlertSettings
from app.db.models import utcnow
from channels.cron import CronSettings
from tests.channels.telegram.support import tg_settings
from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.fakes import telegram as tg
from tests.fakes.http_receiver import HttpReceiver, Received
from tests.fakes.telegram import FakeTelegram
from tests.support.timing import eventually

pytestmark = pytest.mark.slow
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def _alerts(url: str, **extra: Any) -> AlertSettings:
    return AlertSettings(_env_file=None, webhook_url=url, check_seconds=0.1, **extra)  # type: ignore[call-arg]


def _states(received: list[Received], incident: str) -> list[str]:
    said = [json.loads(r.body) for r in received]
    return [s["state"] for s in said if s["incident"] == incident]


@pytest.mark.parametrize("refusal", [tg.CONFLICT, tg.WEBHOOK_SET], ids=["another-poller", "webhook-set"])
async def test_a_409_loop_is_one_alert_and_one_recovery_across_two_replicas(
    serve: ServeApp, refusal: tg.Failure
) -> None:
    async with FakeTelegram() as fake, HttpReceiver() as receiver:
        fake.always["getUpdates"] = refusal
        telegram = tg_settings(fake, mode="polling", polling_retry_seconds=0.05, polling_timeout_seconds=1)
        alerts = _alerts(receiver.url, conflict_streak=3)
        async with (
            serve(channel_settings={"telegram": telegram}, alert_settings=alerts) as one,
            serve(channel_settings={"telegram": telegram}, alert_settings=alerts) as two,
            httpx.AsyncClient(timeout=30) as client,
        ):
            [firing] = await receiver.wait_for(1, timeout=20)
            said = json.loads(firing.body)
            assert (said["incident"], said["kind"]) == ("conflict:telegram", "conflict")
            assert said["state"] == "firing"
            assert "409 Conflict" in said["detail"] and refusal.description[10:40] in said["detail"]
            assert "refuses the connection as a conflict (409)" in said["text"]
            # Exactly one replica polls, so one knows; the other says nothing (and so
            # cannot resolve what the poller sees).
            seen = [srv.runtime.adapters["telegram"].connection_conflicts() for srv in (one, two)]
            [poller] = [srv for srv, s in zip((one, two), seen, strict=True) if s is not None]
            metrics = (await client.get(f"{poller.url}/metrics")).text
            [line] = [x for x in metrics.splitlines() if x.startswith("chatgate_connection_conflicts{")]
            assert float(line.split()[-1]) >= 3
            # The loop goes on: still one alert after many more refusals and checks.
            refused = len(fake.calls_of("getUpdates"))
            await fake.wait_for("getUpdates", refused + 10)
            assert _states(receiver.received, "conflict:telegram") == ["firing"]

            del fake.always["getUpdates"]  # the other poller is gone, or the webhook deleted
            await fake.push_update(tg.update(900, tg.message("back")))
            await fake.wait_for("sendMessage", 1)
            await receiver.wait_for(2, timeout=20)
            polls = len(fake.calls_of("getUpdates"))
            await fake.wait_for("getUpdates", polls + 3)  # and more checks go by
            assert _states(receiver.received, "conflict:telegram") == ["firing", "resolved"]
            metrics = (await client.get(f"{poller.url}/metrics")).text
            assert 'chatgate_connection_conflicts{channel="telegram"} 0.0' in metrics


async def test_an_undelivered_cron_result_is_one_alert_until_its_retry_delivers_it(serve: ServeApp) -> None:
    async with FakeTelegram() as fake, HttpReceiver() as receiver:
        fake.always["sendMessage"] = tg.BLOCKED  # 403: never retried, a dead letter at once
        channels = {
            "telegram": tg_settings(fake, streaming="off"),
            "cron": CronSettings(_env_file=None, tick_seconds=0.1),  # type: ignore[call-arg]
        }
        async with (
            serve(channel_settings=channels, alert_settings=_alerts(receiver.url, language="zh")) as srv,
            httpx.AsyncClient(base_url=srv.url, headers=ADMIN, timeout=30) as client,
        ):
            target = {"channel": "telegram", "chat_id": "4242"}
            # Far enough ahead that a loaded machine's slow request still finds it in the future
            # (with 1 s a CI run's POST arrived 70 ms after it: "run_at is in the past").
            soon = (utcnow() + timedelta(seconds=3)).isoformat()
            once = {"prompt": "daily report", "run_at": soon, "target": target}
            created = await client.post("/admin/api/cron-jobs", json=once)
            assert created.status_code == 201, created.text
            job = created.json()["id"]
            [firing] = await receiver.wait_for(1, timeout=20)
            said = json.loads(firing.body)
            assert (said["incident"], said["kind"], said["state"]) == (f"cron:{job}", "cron", "firing")
            assert "telegram:4242" in said["detail"] and "bot was blocked" in said["detail"]
            assert "定时任务的结果未能送达" in said["text"]
            metrics = (await client.get("/metrics")).text
            assert "chatgate_cron_undelivered 0.0" not in metrics

            # Telegram accepts again; the operator retries the dead letter.
            checks = len(receiver.received)
            del fake.always["sendMessage"]
            retried = await client.post("/admin/api/dead-letters/retry", json={"all": True, "kind": "outbox"})
            assert retried.status_code == 200, retried.text
            await receiver.wait_for(checks + 1, timeout=20)
            assert _states(receiver.received, f"cron:{job}") == ["firing", "resolved"]
            # Resolved once the result left the dead letters (the retry); it is sent after.
            await eventually(lambda: bool(fake.sent_texts()), timeout=20)
            assert "daily report" in fake.sent_texts()[0]
            metrics = (await client.get("/metrics")).text
            assert "chatgate_cron_undelivered 0.0" in metrics
