"""The admin lockout cannot be dodged or aimed (issue 16, item 8): forwarded headers count
only from named proxies, and the count is shared by replicas through the database."""

from __future__ import annotations

import httpx

from tests.conftest import ADMIN_TOKEN, ServeApp

GOOD = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_rotating_forwarded_for_does_not_dodge_the_lockout(serve: ServeApp) -> None:
    async with (
        serve(admin_max_failures=3, admin_lockout_seconds=30) as srv,
        httpx.AsyncClient(timeout=30) as http,
    ):
        api = f"{srv.url}/admin/api/sessions"
        for i in range(3):
            wrong = {"Authorization": f"Bearer nope-{i}", "X-Forwarded-For": f"203.0.113.{i}"}
            assert (await http.get(api, headers=wrong)).status_code == 401
        wrong = {"Authorization": "Bearer nope-x", "X-Forwarded-For": "203.0.113.99"}
        assert (await http.get(api, headers=wrong)).status_code == 429
        # Locked as itself: the peer address, whatever it claims to forward.
        assert (await http.get(api, headers={**GOOD, "X-Forwarded-For": "198.51.100.7"})).status_code == 429
        assert (await http.get(f"{srv.url}/healthz")).status_code == 200


async def test_behind_a_named_proxy_each_client_is_counted_and_others_are_not_locked(serve: ServeApp) -> None:
    settings = dict(admin_max_failures=3, admin_lockout_seconds=30, trusted_proxies=["127.0.0.1"])
    async with serve(**settings) as srv, httpx.AsyncClient(timeout=30) as http:
        api = f"{srv.url}/admin/api/sessions"
        attacker = {"X-Forwarded-For": "203.0.113.5"}
        for i in range(3):
            resp = await http.get(api, headers={**attacker, "Authorization": f"Bearer nope-{i}"})
            assert resp.status_code == 401
        assert (await http.get(api, headers={**attacker, **GOOD})).status_code == 429
        # The real admin behind the same proxy is not locked out by someone else's failures;
        # a spoofed first hop does not move the count either (the proxy appends the real one).
        assert (await http.get(api, headers={**GOOD, "X-Forwarded-For": "198.51.100.7"})).status_code == 200
        spoofed = {"X-Forwarded-For": "198.51.100.7, 203.0.113.5"}
        assert (await http.get(api, headers={**spoofed, **GOOD})).status_code == 429


async def test_replicas_share_one_count(serve: ServeApp) -> None:
    settings = dict(admin_max_failures=3, admin_lockout_seconds=30)
    async with serve(**settings) as one, serve(**settings) as two, httpx.AsyncClient(timeout=30) as http:
        wrong = {"Authorization": "Bearer nope"}
        assert (await http.get(f"{one.url}/admin/api/sessions", headers=wrong)).status_code == 401
        assert (await http.get(f"{two.url}/admin/api/sessions", headers=wrong)).status_code == 401
        assert (await http.post(f"{one.url}/admin/login", json={"token": "nope"})).status_code == 401
        for srv in (one, two):
            locked = await http.get(f"{srv.url}/admin/api/sessions", headers=GOOD)
            assert locked.status_code == 429, locked.text
            assert "too many wrong admin tokens" in locked.json()["detail"]
