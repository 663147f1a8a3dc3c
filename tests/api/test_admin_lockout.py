"""Guessing the admin token: after a few wrong tries an address is locked out for a while."""

from __future__ import annotations

import asyncio

import httpx

from tests.conftest import ADMIN_TOKEN, ServeApp


async def test_wrong_admin_tokens_lock_the_address_out_then_it_recovers(serve: ServeApp) -> None:
    async with (
        serve(admin_max_failures=3, admin_lockout_seconds=1.5) as srv,
        httpx.AsyncClient(timeout=30) as http,
    ):
        api = f"{srv.url}/admin/api/sessions"
        good = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        # No token at all is not a guess: it never counts.
        for _ in range(5):
            assert (await http.get(api)).status_code == 401
        assert (await http.get(api, headers=good)).status_code == 200
        # Wrong tokens through the API and through the dashboard login count together.
        assert (await http.get(api, headers={"Authorization": "Bearer nope-1"})).status_code == 401
        assert (await http.get(api, headers={"Authorization": "Bearer nope-2"})).status_code == 401
        login = await http.post(f"{srv.url}/admin/login", json={"token": "nope-3"})
        assert login.status_code == 401
        # Locked: even the right token is refused, with a reason and Retry-After.
        locked = await http.get(api, headers=good)
        assert locked.status_code == 429
        assert "too many wrong admin tokens" in locked.json()["detail"]
        assert 1 <= int(locked.headers["Retry-After"]) <= 2
        assert (await http.post(f"{srv.url}/admin/login", json={"token": ADMIN_TOKEN})).status_code == 429
        # The service keeps serving everything else meanwhile.
        assert (await http.get(f"{srv.url}/healthz")).status_code == 200
        await asyncio.sleep(1.6)
        assert (await http.get(api, headers=good)).status_code == 200
        assert (await http.post(f"{srv.url}/admin/login", json={"token": ADMIN_TOKEN})).status_code == 200
