"""Guessing the admin token: after a few wrong tries an address is locked out for a while."""

from __future__ import annotations

import math

import httpx

from tests.conftest import ADMIN_TOKEN, ServeApp
from tests.support.timing import eventually, scaled

# Long enough that a loaded machine cannot let the lock run out between the third wrong
# token and the checks of the lock (1.5 s did, once, at a busy first phase's start).
LOCKOUT = scaled(8.0)


async def test_wrong_admin_tokens_lock_the_address_out_then_it_recovers(serve: ServeApp) -> None:
    async with (
        serve(admin_max_failures=3, admin_lockout_seconds=LOCKOUT) as srv,
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
        assert 1 <= int(locked.headers["Retry-After"]) <= math.ceil(LOCKOUT)
        assert (await http.post(f"{srv.url}/admin/login", json={"token": ADMIN_TOKEN})).status_code == 429
        # The service keeps serving everything else meanwhile.
        assert (await http.get(f"{srv.url}/healthz")).status_code == 200

        # Once the lock runs out, the right token gets in again (asking with it meanwhile does
        # not make the lock longer).
        async def admitted() -> bool:
            return (await http.get(api, headers=good)).status_code == 200

        await eventually(admitted, timeout=LOCKOUT + 10, interval=0.25)
        assert (await http.post(f"{srv.url}/admin/login", json={"token": ADMIN_TOKEN})).status_code == 200
