"""Admin REST API for cron jobs: CRUD behind the bearer token, clear 4xx on bad input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from app.db.models import utcnow
from channels.cron import CronSettings
from tests.conftest import ADMIN_TOKEN, ServeApp, webhook_settings

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def channels() -> dict[str, Any]:
    # A long tick: these tests are about the API, not about firing.
    return {"webhook": webhook_settings(), "cron": CronSettings(_env_file=None, tick_seconds=3600)}  # type: ignore[call-arg]


async def test_crud(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels()) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url, headers=ADMIN) as c,
    ):
        created = await c.post(
            "/admin/api/cron-jobs",
            json={
                "prompt": "morning summary",
                "schedule": "0 9 * * *",
                "timezone": "Asia/Shanghai",
                "target": {"channel": "webhook", "chat_id": "team"},
            },
        )
        assert created.status_code == 201, created.text
        job = created.json()
        assert job["source_session_key"] == "webhook:team"  # the target chat's session by default
        assert job["enabled"] is True and job["created_by"] == "admin"
        fire = datetime.fromisoformat(job["next_fire_at"])
        assert (fire.hour, fire.minute) == (1, 0)  # 09:00 in Shanghai
        assert utcnow() < fire <= utcnow() + timedelta(days=1)

        once = await c.post(
            "/admin/api/cron-jobs",
            json={
                "prompt": "once",
                "run_at": (utcnow() + timedelta(hours=1)).isoformat(),
                "target": {"channel": "webhook", "chat_id": "x", "thread_id": "t"},
                "source_session_key": "custom-key",
            },
        )
        assert once.status_code == 201, once.text
        assert once.json()["schedule"] is None and once.json()["source_session_key"] == "custom-key"

        listed = await c.get("/admin/api/cron-jobs")
        assert [j["id"] for j in listed.json()["jobs"]] == [job["id"], once.json()["id"]]
        only = await c.get("/admin/api/cron-jobs", params={"session_key": "custom-key"})
        assert [j["id"] for j in only.json()["jobs"]] == [once.json()["id"]]

        got = await c.get(f"/admin/api/cron-jobs/{job['id']}")
        assert got.status_code == 200 and got.json() == job

        patched = await c.patch(f"/admin/api/cron-jobs/{job['id']}", json={"timezone": "UTC", "prompt": "hi"})
        assert patched.status_code == 200, patched.text
        assert patched.json()["prompt"] == "hi"
        assert datetime.fromisoformat(patched.json()["next_fire_at"]).hour == 9

        disabled = await c.post(f"/admin/api/cron-jobs/{job['id']}/disable")
        assert (disabled.json()["enabled"], disabled.json()["next_fire_at"]) == (False, None)
        enabled = await c.post(f"/admin/api/cron-jobs/{job['id']}/enable")
        assert enabled.json()["enabled"] is True and enabled.json()["next_fire_at"] is not None

        assert (await c.delete(f"/admin/api/cron-jobs/{job['id']}")).status_code == 204
        assert (await c.get(f"/admin/api/cron-jobs/{job['id']}")).status_code == 404
        assert (await c.delete(f"/admin/api/cron-jobs/{job['id']}")).status_code == 404
        assert (await c.post(f"/admin/api/cron-jobs/{job['id']}/enable")).status_code == 404


async def test_auth_and_bad_input(serve: ServeApp) -> None:
    good = {"prompt": "p", "schedule": "*/5 * * * *", "target": {"channel": "webhook", "chat_id": "c"}}
    async with (
        serve(channel_settings=channels()) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url) as c,
    ):
        assert (await c.get("/admin/api/cron-jobs")).status_code == 401
        assert (await c.post("/admin/api/cron-jobs", json=good)).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await c.delete("/admin/api/cron-jobs/1", headers=wrong)).status_code == 401

        past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
        bad: list[tuple[str, dict[str, Any], str]] = [
            ("bad cron", {**good, "schedule": "0 25 * * *"}, "invalid cron"),
            ("too few fields", {**good, "schedule": "* *"}, "5 fields"),
            ("unknown tz", {**good, "timezone": "Mars/Base"}, "time zone"),
            ("both kinds", {**good, "run_at": "2030-01-01T00:00:00Z"}, "either"),
            ("neither kind", {k: v for k, v in good.items() if k != "schedule"}, "either"),
            ("past run_at", {k: v for k, v in good.items() if k != "schedule"} | {"run_at": past}, "past"),
            ("unknown channel", {**good, "target": {"channel": "fax", "chat_id": "c"}}, "not served"),
            ("cron target", {**good, "target": {"channel": "cron", "chat_id": "c"}}, "not served"),
            ("empty prompt", {**good, "prompt": ""}, "prompt"),
            ("unknown field", {**good, "colour": "red"}, "colour"),
        ]
        for reason, body, detail in bad:
            resp = await c.post("/admin/api/cron-jobs", json=body, headers=ADMIN)
            assert resp.status_code == 422, (reason, resp.status_code, resp.text)
            assert detail in resp.text, (reason, resp.text)
        assert (await c.get("/admin/api/cron-jobs", headers=ADMIN)).json()["jobs"] == []

        created = (await c.post("/admin/api/cron-jobs", json=good, headers=ADMIN)).json()
        url = f"/admin/api/cron-jobs/{created['id']}"
        for body in ({"schedule": "nope"}, {"timezone": "Nowhere"}, {"max_runs": 0}):
            resp = await c.patch(url, json=body, headers=ADMIN)
            assert resp.status_code == 422, (body, resp.text)
        assert (await c.get(url, headers=ADMIN)).json() == created  # unchanged
        assert (await c.get("/admin/api/cron-jobs/abc", headers=ADMIN)).status_code == 422


async def test_routes_are_documented_in_openapi(serve: ServeApp) -> None:
    async with (
        serve(channel_settings=channels()) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url) as c,
    ):
        schema = (await c.get("/openapi.json")).json()
    ops = schema["paths"]["/admin/api/cron-jobs"]
    assert set(ops) == {"get", "post"}
    assert ops["post"]["description"].startswith("Create a job")
    assert set(schema["paths"]["/admin/api/cron-jobs/{job_id}"]) == {"get", "patch", "delete"}


async def test_a_job_is_refused_while_the_cron_channel_is_not_served(serve: ServeApp) -> None:
    """Stored with a 201, such a job would never run: refused with the reason instead."""
    async with (
        serve(channel_settings={"webhook": webhook_settings()}) as srv,
        httpx.AsyncClient(timeout=30, base_url=srv.url, headers=ADMIN) as c,
    ):
        job = {"prompt": "hi", "schedule": "0 9 * * *", "target": {"channel": "webhook", "chat_id": "team"}}
        refused = await c.post("/admin/api/cron-jobs", json=job)
        assert refused.status_code == 409, refused.text
        assert "add `cron` to CHANNELS" in refused.json()["detail"]
        assert (await c.get("/admin/api/cron-jobs")).json()["jobs"] == []
