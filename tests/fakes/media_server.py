"""A file host as the platforms' CDNs are (QQ's multimedia.nt.qq.com.cn, a bridge's file
server): `GET /files/<name>` serves what the test put in `files`, with `Content-Length`,
and records each download."""

from __future__ import annotations

from aiohttp import web

from tests.fakes.local_server import LocalServer


class FakeMediaServer(LocalServer):
    def __init__(self) -> None:
        self.files: dict[str, tuple[bytes, str]] = {}
        self.downloads: list[str] = []

    def url_of(self, name: str) -> str:
        return f"{self.url}/files/{name}"

    async def _file(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self.files:
            return web.Response(status=404, text="no such file")
        self.downloads.append(name)
        data, content_type = self.files[name]
        return web.Response(body=data, content_type=content_type)

    async def __aenter__(self) -> FakeMediaServer:
        app = web.Application()
        app.router.add_get("/files/{name}", self._file)
        await self._serve(app)
        return self
