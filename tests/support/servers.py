"""Run chatgate for real: in this event loop (uvicorn on a free port) or as a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from tests.support.timing import scaled
from tests.support.zygote import Forked, zygote

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunningApp:
    url: str
    app: FastAPI

    @property
    def runtime(self) -> Any:
        return self.app.state.runtime


class _Server(uvicorn.Server):
    """uvicorn's server, whose main loop ends as soon as `exit()` is called rather than at
    its next 0.1 s tick (several hundred apps are served and stopped in the suite). Each
    tick's work (`on_tick`) is unchanged."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self._exit = asyncio.Event()

    def exit(self) -> None:
        self.should_exit = True
        self._exit.set()

    async def main_loop(self) -> None:
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 1) % 864000
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exit.wait(), 0.1)
            should_exit = await self.on_tick(counter)


@contextlib.asynccontextmanager
async def serve_in_loop(app: FastAPI) -> AsyncIterator[RunningApp]:
    """Serve `app` with uvicorn on 127.0.0.1 and a free port, lifespan included."""
    from app.api.app import server_options

    config = uvicorn.Config(
        app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", **server_options(app)
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server stopped during start-up")
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        yield RunningApp(url=f"http://127.0.0.1:{port}", app=app)
    finally:
        server.exit()
        await task


BANNER = "chatgate is serving on"  # app/firstrun.py's first line, printed once the server listens


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _kept_ports() -> Iterator[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    first = 20_000 + (int(worker) % 12 if worker.isdigit() else 0) * 1_000
    for port in range(first, first + 1_000):
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        yield port
    raise RuntimeError(f"no free port left in {first}-{first + 999}")


_KEPT = _kept_ports()


def kept_port() -> int:
    """A free port for a server that must come back on it after it died.

    A port from `free_port()` is in the kernel's ephemeral range (32768-60999 here), where
    another worker's `free_port()` or any outgoing connection may take it while our server
    is down. These come from below that range, 1,000 for each xdist worker (up to 12), each
    handed out once, so nothing else in the suite gets them.
    """
    return next(_KEPT)


_STARTED: list[ServerProcess] = []  # by the running test (one at a time per worker process)


class _PortTaken(Exception):
    """The server process could not bind its port: someone else took it first."""


async def start_together(envs: Mapping[str, Mapping[str, str]]) -> dict[str, ServerProcess]:
    """One `ServerProcess` per name, started at the same time and off the event loop (each
    `start` polls /readyz synchronously; fakes served by this loop keep answering the
    servers' start-up calls meanwhile). If one fails to start, the others are killed."""
    results = await asyncio.gather(
        *(asyncio.to_thread(ServerProcess(env).start) for env in envs.values()), return_exceptions=True
    )
    started = [r for r in results if isinstance(r, ServerProcess)]
    for result in results:
        if isinstance(result, BaseException):
            for server in started:
                server.kill()
            raise result
    return dict(zip(envs, started, strict=True))


async def stop_all(*servers: ServerProcess) -> None:
    """SIGTERM every server and wait for them together, off the event loop: a server's
    hand-over may still be talking to a fake platform served by this loop (a long poll to
    end, a stream to close), which a blocking `stop()` here would leave unanswered until
    the server is killed."""
    await asyncio.gather(*(asyncio.to_thread(server.stop) for server in servers))


def started_logs() -> list[tuple[str, str]]:
    """(name, log tail) of each server process started by the running test, for its report."""
    return [(f"server :{server.port}", server.log()) for server in _STARTED]


def forget_started() -> None:
    """A test begins: the servers of earlier tests are not its concern."""
    for server in _STARTED:
        if server.log_path is not None and (server.proc is None or server.proc.poll() is not None):
            server.log_path.unlink(missing_ok=True)
    _STARTED.clear()


class ServerProcess:
    """`python -m app serve` in its own process, for multi-process and crash tests."""

    def __init__(self, env: Mapping[str, str], port: int | None = None, *, preloaded: bool = True) -> None:
        # preloaded: forked from this worker's preloaded interpreter (tests/support/zygote.py),
        # the same `python -m app serve` without importing everything again (~1.1 CPU-s a
        # server); the benchmarks start theirs from scratch, as a deployment does, and so does
        # every test with TEST_SERVER_ZYGOTE=off (an A/B, or ruling the zygote out of a bug).
        self.preloaded = preloaded and os.environ.get("TEST_SERVER_ZYGOTE", "on") != "off"
        # A port picked here is free now, but another test worker (pytest-xdist) may bind
        # it before the server does: then start() picks another one (a given port is kept).
        self._pick_port = port is None
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, **env}
        self.env.setdefault("LOG_LEVEL", "WARNING")
        # As `make_settings` for the servers in the test's own process: the platforms' limits
        # (Telegram's one message a second per chat, DingTalk's twenty a minute) would turn a
        # replica test's dozen answers into a dozen seconds. A test about pacing turns it on.
        self.env.setdefault("PACING_ENABLED", "false")
        self.proc: Forked | subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None

    def start(self, timeout: float = 60.0) -> ServerProcess:  # start-up on a loaded machine
        for _ in range(3):
            try:
                return self._start(timeout)
            except _PortTaken:
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        return self._start(timeout)

    def _start(self, timeout: float) -> ServerProcess:
        import tempfile

        fd, name = tempfile.mkstemp(prefix="chatgate-server-", suffix=".log")
        os.close(fd)
        self.log_path = Path(name)
        _STARTED.append(self)
        args = ["serve", "--host", "127.0.0.1", "--port", str(self.port)]
        if self.preloaded:
            self.proc = zygote(str(ROOT)).spawn(args, self.env, str(ROOT), str(self.log_path))
        else:
            with self.log_path.open("ab") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "app", *args],
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        deadline = time.monotonic() + scaled(timeout)
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._pick_port and "address already in use" in self.log().lower():
                    raise _PortTaken(self.port)
                raise RuntimeError(f"server exited early:\n{self.log()}")
            try:
                # Ready, and ours: another worker's server may have bound the port first (ours
                # then exits on "address already in use"), and its /readyz answers 200 too.
                # Only the process that listens prints the banner.
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200 and self._listening():
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()  # never leave a half-started server running past the test
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def _listening(self) -> bool:
        return self.log_path is not None and BANNER in self.log_path.read_text(errors="replace")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, like a crashed machine."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM without waiting: the replica hands its work over, then exits (`app.shutdown`)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        """The exit status once the process ended (raises `subprocess.TimeoutExpired`)."""
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(scaled(15))
            except subprocess.TimeoutExpired:
                self.kill()
