"""Wrong admin tokens counted per client address, shared by the admin API's bearer check
and the dashboard's login (`app.api.deps.require_admin`, `app.web.pages.admin_login`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from fastapi import HTTPException, Request
from sqlalchemy import case, delete, select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.db.models import admin_auth_failures as failures_table
from app.db.upsert import insert_for
from app.runtime import Runtime


class AdminLockout:
    """Wrong admin tokens per client address: after `limit` within `window` seconds the
    address gets 429 (even with the right token) until the window has passed.

    The count is a row per address in the database, so every replica sees the same count:
    N replicas do not give an attacker N times `limit` tries. The window opens with the first
    failure and closes `window` seconds later.
    """

    def __init__(self, engine: AsyncEngine, limit: int, window: float) -> None:
        self.engine = engine
        self.limit = limit
        self.window = window

    async def check(self, client: str) -> None:
        now = time.time()
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(failures_table.c.failures, failures_table.c.window_start).where(
                        failures_table.c.client == client[:64]
                    )
                )
            ).first()
        if row is None or now - row.window_start >= self.window or row.failures < self.limit:
            return
        retry = max(1, math.ceil(self.window - (now - row.window_start)))
        raise HTTPException(
            429,
            f"too many wrong admin tokens from this address; retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )

    async def failed(self, client: str) -> None:
        now = time.time()
        cutoff = now - self.window
        table = failures_table
        async with self.engine.begin() as conn:
            stmt = insert_for(conn.dialect.name, table).values(
                client=client[:64], failures=1, window_start=now
            )
            expired = stmt.excluded.window_start - table.c.window_start >= self.window
            await conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[table.c.client],
                    set_={
                        "failures": case((expired, 1), else_=table.c.failures + 1),
                        "window_start": case(
                            (expired, stmt.excluded.window_start), else_=table.c.window_start
                        ),
                    },
                )
            )
            # Forget closed windows, so the table stays as small as the set of guessers.
            await conn.execute(delete(table).where(table.c.window_start < cutoff - self.window))


def client_address(request: Request, trusted_proxies: Sequence[str]) -> str:
    """The client's address: the peer's, or, when the peer is a proxy the operator named
    (`TRUSTED_PROXIES`), the last `X-Forwarded-For` entry no trusted proxy added."""
    peer = request.client.host if request.client else "unknown"
    if peer not in trusted_proxies:
        return peer
    hops = [h.strip() for h in ",".join(request.headers.getlist("x-forwarded-for")).split(",") if h.strip()]
    for hop in reversed(hops):
        if hop not in trusted_proxies:
            return hop[:64]
    return peer


def admin_failures(request: Request) -> tuple[AdminLockout, str]:
    """The app's lockout (made by `create_app`) and this request's client address."""
    lockout: AdminLockout = request.app.state.admin_failures
    runtime: Runtime = request.app.state.runtime
    return lockout, client_address(request, runtime.settings.trusted_proxies)
