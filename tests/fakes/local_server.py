"""Fake platforms are real local HTTP servers: this serves one on a free port."""

from __future__ import annotations

from typing import Any

from aiohttp import web


class LocalServer:
    """Base of the fakes: `_serve(app)` in `__aenter__` starts it, `__aexit__` stops it."""

    url: str = ""
    _runner: web.AppRunner | None = None

    async def _serve(self, app: web.Application, path: str = "", **runner_options: Any) -> int:
        """Start `app` on 127.0.0.1 at a port the OS picks; `url` is that origin plus `path`.

        `runner_options` go to `web.AppRunner` (e.g. a short `shutdown_timeout` for fakes that
        hold WebSockets or long polls open). Returns the port.
        """
        self._runner = web.AppRunner(app, **runner_options)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}{path}"
        return port

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
