"""A TCP proxy a test controls: between chatgate and PostgreSQL, to cut the database off.

`block()` drops every open connection and refuses new ones (accepted, then closed at
once, as a host whose database is down); `unblock()` lets connections through again.
`lose_reply_with(marker)` drops the connection that is answered with `marker` instead
of passing that answer on: the statement ran (and committed), its answer never arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class TcpProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.blocked = False
        self.refused = 0  # connections refused while blocked
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._lose_marker: bytes | None = None
        self.lost_replies = 0

    def lose_reply_with(self, marker: bytes) -> None:
        """Drop the next server answer holding `marker` (once), and its connection."""
        self._lose_marker = marker

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.block()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def block(self) -> None:
        self.blocked = True
        for writer in list(self._writers):
            writer.transport.abort()  # a reset, as a dead host or a killed server gives
        self._writers.clear()

    def unblock(self) -> None:
        self.blocked = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.blocked:
            self.refused += 1
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer, answers=True))
        finally:
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    async def _pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, answers: bool = False
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if answers and self._lose_marker is not None and self._lose_marker in data:
                    self._lose_marker = None
                    self.lost_replies += 1
                    break  # both ends are reset below: the client sees the connection drop
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


@asynccontextmanager
async def tcp_proxy(target_host: str, target_port: int) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy(target_host, target_port)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


def via_proxy(database_url: str, proxy: TcpProxy) -> str:
    """`database_url` with its host and port replaced by the proxy's."""
    from sqlalchemy.engine import make_url

    url = make_url(database_url).set(host="127.0.0.1", port=proxy.port)
    return url.render_as_string(hide_password=False)
