"""Bodies and frames are bounded while being read (issue 16, items 2 and 3): a server
process's resident memory stays flat under oversized bodies and first frames, anonymous
admin requests are refused before their body is read, and the server keeps serving."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from tests.conftest import ADMIN_TOKEN
from tests.support.servers import ServerProcess

# serial: floods of oversized bodies and frames measured by the server's peak RSS; other
# workers' load turns the bounded reads into timeouts.
pytestmark = [pytest.mark.serial, pytest.mark.alone]

MiB = 1024 * 1024


def rss_mib(pid: int, field: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no {field}")


def peak_growth_mib(pid: int, before: float) -> float:
    """How far the peak resident set (VmHWM) rose above `before`: transient spikes count."""
    return rss_mib(pid, "VmHWM") - before


@contextmanager
def server(tmp_path: Path, **env: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        {
            "DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'bounds.db'}",
            "ADMIN_TOKEN": ADMIN_TOKEN,
            "WEBHOOK_SECRET": "s",
            "CHANNELS": "webhook,browser",
            "GATEWAY_TOKENS": json.dumps(
                [{"token": "tok-0123456789abcdef", "subject": "a", "session_keys": ["web:a"]}]
            ),
            "MAX_BODY_BYTES": str(MiB),
            **env,
        }
    ).start()
    try:
        yield proc
    finally:
        proc.stop()


def chunked_post(
    port: int, path: str, headers: dict[str, str], total: int, chunk: int = MiB
) -> tuple[int, int]:
    """POST `total` bytes with chunked encoding until the server answers; (status, bytes sent)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
    )
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
    sent = 0
    data = b"[" + b"1," * (chunk // 2 - 1) + b"1"
    try:
        sock.sendall(head.encode())
        sock.setblocking(False)
        while sent < total:
            try:
                reply = sock.recv(4096)
                if reply:
                    return int(reply.split(b" ", 2)[1]), sent
            except BlockingIOError:
                pass
            sock.setblocking(True)
            sock.sendall(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            sock.setblocking(False)
            sent += len(data)
        sock.setblocking(True)
        sock.sendall(b"0\r\n\r\n")
        reply = sock.recv(4096)
        return int(reply.split(b" ", 2)[1]), sent
    except (BrokenPipeError, ConnectionResetError):
        sock.setblocking(True)
        try:
            reply = sock.recv(4096)
        except OSError:
            reply = b""
        return (int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/") else -1), sent
    finally:
        sock.close()


def test_bodies_are_bounded_while_read_and_anonymous_admin_requests_never_read(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        assert srv.proc is not None
        port = srv.port
        before = rss_mib(srv.proc.pid)
        auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        # Anonymous: 401 before the body is read (a 100 MB body is never taken in).
        status, sent = chunked_post(port, "/admin/api/identity-links", {}, 100 * MiB)
        assert status == 401
        assert sent < 20 * MiB, sent
        # Declared too large: 413 from the Content-Length alone, on any route.
        for path in (
            "/admin/api/identity-links",
            "/admin/login",
            "/channels/webhook",
            "/admin/api/cron-jobs",
        ):
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            sock.sendall(
                f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {200 * MiB}\r\n"
                f"Authorization: Bearer {ADMIN_TOKEN}\r\nContent-Type: application/json\r\n\r\n".encode()
            )
            reply = sock.recv(4096)
            sock.close()
            assert reply.split(b" ", 2)[1] == b"413", (path, reply[:200])
        # Undeclared (chunked), authenticated: cut at the limit while reading, six at once.
        for path in ("/admin/api/identity-links", "/admin/login", "/channels/webhook"):
            statuses = []
            for _ in range(6):
                status, sent = chunked_post(port, path, auth, 100 * MiB)
                statuses.append(status)
                assert sent < 20 * MiB, (path, sent)
            assert set(statuses) == {413}, (path, statuses)
        grown = peak_growth_mib(srv.proc.pid, before)
        assert grown < 60, f"peak RSS grew by {grown:.0f} MiB"
        # Still serving, bodies under the limit work.
        ok = httpx.post(f"{srv.url}/admin/login", json={"token": ADMIN_TOKEN})
        assert ok.status_code == 200
        assert httpx.get(f"{srv.url}/healthz").status_code == 200


async def _big_first_frame(url: str, size: int, n: int) -> int | None:
    # OneBot bridges authenticate with headers at the handshake; the gateway ignores these.
    headers = {"Authorization": "Bearer t", "X-Self-ID": str(10_000 + n)}
    try:
        async with connect(
            url, max_size=None, open_timeout=10, close_timeout=5, additional_headers=headers
        ) as ws:
            try:
                await ws.send(json.dumps({"type": "auth", "token": "x" * size}))
                await asyncio.wait_for(ws.recv(), 10)
            except ConnectionClosed as exc:
                return exc.rcvd.code if exc.rcvd else None
    except (ConnectionClosed, InvalidStatus, OSError):
        return None
    return 0


@pytest.mark.parametrize("path", ["/ws", "/channels/onebot/ws"])
def test_first_websocket_frames_are_bounded_before_auth(tmp_path: Path, path: str) -> None:
    env = {
        "CHANNELS": "webhook,browser,onebot",
        "ONEBOT_ACCESS_TOKEN": "t",
        "ONEBOT_MAX_FRAME_BYTES": str(MiB),
    }
    with server(tmp_path, **env) as srv:
        assert srv.proc is not None
        base = srv.url.replace("http://", "ws://") + path
        before = rss_mib(srv.proc.pid)

        async def flood() -> list[int | None]:
            return list(await asyncio.gather(*(_big_first_frame(base, 15 * MiB, n) for n in range(20))))

        t0 = time.monotonic()
        codes = asyncio.run(flood())
        grown = peak_growth_mib(srv.proc.pid, before)
        assert all(code in (1009, None) for code in codes), codes
        assert 1009 in codes, codes
        assert grown < 60, f"peak RSS grew by {grown:.0f} MiB in {time.monotonic() - t0:.1f} s"
        assert httpx.get(f"{srv.url}/healthz").status_code == 200
