"""A real local HTTP server that records what it receives (webhook callback target)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from tests.fakes.local_server import LocalServer
from tests.support.timing import scaled


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class HttpReceiver(LocalServer):
    """Answers 500 to the first `fail_first` requests, then 200; records the accepted ones."""

    def __init__(self, fail_first: int = 0, status: int = 200, delay: float = 0.0) -> None:
        self.fail_first = fail_first
        self.delay = delay  # seconds before answering: deliveries stay in flight that long
        self.status = status
        self.attempts = 0
        self.received: list[Received] = []
        self._changed = asyncio.Condition()

    async def _handle(self, request: web.Request) -> web.Response:
        self.attempts += 1
        body = await request.read()
        if self.attempts <= self.fail_first:
            return web.Response(status=500, text="try again")
        if self.delay:
            await asyncio.sleep(self.delay)
        async with self._changed:
            self.received.append(
                Received(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
            )
            self._changed.notify_all()
        return web.Response(status=self.status, text="ok")

    async def wait_for(self, count: int, timeout: float = 10) -> list[Received]:
        async with self._changed:
            await asyncio.wait_for(
                self._changed.wait_for(lambda: len(self.received) >= count), scaled(timeout)
            )
        return list(self.received)

    async def wait_until(
        self, predicate: Callable[[list[Received]], bool], timeout: float = 10
    ) -> list[Received]:
        """Wait until `predicate(received)` holds (e.g. a set of distinct ids, redeliveries allowed)."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: predicate(self.received)), scaled(timeout))
        return list(self.received)

    async def __aenter__(self) -> HttpReceiver:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        await self._serve(app, "/callback")
        return self
