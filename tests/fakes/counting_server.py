"""An HTTP server that counts every request it gets, for the SSRF tests.

It listens on one port at 127.0.0.1, 127.0.0.2 and ::1, so any loopback spelling of a URL
(`localhost`, `2130706433`, `[::ffff:127.0.0.1]`, `0.0.0.0` …) reaches it if a fetcher
lets it through. `GET /file` answers a few bytes; any path with `?to=<url>` answers a
302 to that URL; `/bomb` answers `bomb` (set by the test) with `Content-Encoding: gzip`.
Each request is recorded as `(Host header, path, Authorization header)`.
"""

from __future__ import annotations

import zlib
from typing import Any

from aiohttp import web

BODY = b"internal secret"


def gzip_bomb(decoded_bytes: int, chunk: int = 1 << 20) -> bytes:
    """A gzip body of zeros that expands to `decoded_bytes`, built without holding them."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(chunk)
    out = [packer.compress(zeros) for _ in range(decoded_bytes // chunk)]
    out.append(packer.flush())
    return b"".join(out)


class CountingServer:
    def __init__(self) -> None:
        self.hits: list[tuple[str, str, str | None]] = []
        self.bomb = b""
        self.port = 0
        self._runner: web.AppRunner | None = None

    def url(self, host: str = "127.0.0.1", path: str = "/file") -> str:
        return f"http://{host}:{self.port}{path}"

    def hits_on(self, host: str) -> int:
        return sum(1 for h, _, _ in self.hits if h.rpartition(":")[0] == host)

    async def _any(self, request: web.Request) -> web.StreamResponse:
        self.hits.append((request.host, request.path, request.headers.get("Authorization")))
        if "to" in request.query:
            raise web.HTTPFound(request.query["to"])
        if request.path == "/bomb":
            return web.Response(body=self.bomb, headers={"Content-Encoding": "gzip"})
        return web.Response(body=BODY, content_type="image/png")

    async def __aenter__(self) -> CountingServer:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._any)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        first = web.TCPSite(self._runner, "127.0.0.1", 0)
        await first.start()
        self.port = int(first._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        for host in ("127.0.0.2", "::1"):
            await web.TCPSite(self._runner, host, self.port).start()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
