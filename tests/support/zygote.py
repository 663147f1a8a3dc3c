"""A preloaded interpreter that forks `chatgate serve` processes for the tests.

`python -m app serve` spends ~1.1 of its ~1.5 CPU-s to readiness importing (FastAPI,
SQLAlchemy, pydantic, the app's own modules), and the suite starts ~90 of them. One of
these per pytest worker imports all that once; each server is then a `fork()` of it that
runs `app.cli.main(["serve", ...])` with the test's environment, working directory and
log file, in a process of its own: its own pid, sockets, signals and exit status, killed
by SIGKILL like any other (as the standard library's `multiprocessing` forkserver does).
What runs in the forked process is the same code `python -m app` runs; only the imports
were done before the environment was set, which is why nothing in `app` or `channels`
reads the environment at import time (`tests/test_zygote.py` checks it).

Protocol, one JSON object per line: the test process writes
`{"args": [...], "env": {...}, "cwd": "...", "log": "..."}` to stdin and reads
`{"pid": N}` back; whenever a forked process ends, `{"exit": N, "code": C}` follows
(`C` as `subprocess.Popen.returncode` gives it: negative for a signal). At the end of
stdin the processes still running are killed and the zygote exits.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import traceback
from typing import Any, NoReturn

# What `chatgate serve` imports before it reads a setting, and uvicorn's parts it loads.
PRELOAD = (
    "app.api.app",
    "app.cli",
    "app.serve_cli",
    "app.doctor",
    "app.firstrun",
    "app.agent.openai_provider",
    "uvicorn",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.protocols.http.auto",
    "uvicorn.protocols.websockets.auto",
)


class _Child(Exception):
    """Raised in a forked process to leave the zygote's loop and run the command."""

    def __init__(self, request: dict[str, Any]) -> None:
        super().__init__()
        self.request = request


def main() -> int:
    import importlib

    for name in PRELOAD:
        importlib.import_module(name)
    if threading.active_count() != 1:  # a fork would copy a lock some thread holds
        print(json.dumps({"error": "threads after preloading"}), flush=True)
        return 1
    try:
        _serve()
    except _Child as child:
        return _run(child.request)
    return 0


def _serve() -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the workers; they end us
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    live: set[int] = set()
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 4096):
                            break
                    except BlockingIOError:
                        break
                continue
            data = os.read(0, 65536)
            if not data:
                _end(live)
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    signal.signal(signal.SIGINT, signal.default_int_handler)
                    selector.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    raise _Child(request)
                live.add(pid)
                _say({"pid": pid}, live)
        while live:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            live.discard(pid)
            _say({"exit": pid, "code": os.waitstatus_to_exitcode(status)}, live)


def _say(message: dict[str, Any], live: set[int]) -> None:
    try:
        os.write(1, json.dumps(message).encode() + b"\n")
    except BrokenPipeError:  # the test process is gone
        _end(live)


def _end(live: set[int]) -> NoReturn:
    """The test process is done with us (or gone): kill and reap what we forked, and exit."""
    for pid in live:
        os.kill(pid, signal.SIGKILL)
    for pid in live:
        os.waitpid(pid, 0)
    raise SystemExit(0)


def _run(request: dict[str, Any]) -> int:
    """In the forked process: become `python -m app <args>` with the given surroundings."""
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    args = list(request["args"])
    sys.argv = [os.path.join(request["cwd"], "app", "__main__.py"), *args]
    from app.cli import main as chatgate

    try:
        return chatgate(args)
    except SystemExit as exc:  # as the interpreter reports it for `python -m app`
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1


# --- the tests' side -------------------------------------------------------------------


class Forked:
    """A process the zygote forked, with the part of `subprocess.Popen` the tests use."""

    def __init__(self, zygote: Zygote, pid: int) -> None:
        self._zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid, timeout=timeout)
            if code is None:
                raise subprocess.TimeoutExpired(f"chatgate (pid {self.pid})", timeout or 0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # as Popen: never signal a pid that may have been reused
            os.kill(self.pid, sig)


class Zygote:
    """One per test process, started on first use and ended with it."""

    def __init__(self, root: str) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.zygote"],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._lock = threading.Lock()  # one request and its answer at a time
        self._exits: dict[int, int] = {}
        self._answers: list[dict[str, Any]] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            message = json.loads(line)
            with self._changed:
                if "exit" in message:
                    self._exits[message["exit"]] = message["code"]
                else:
                    self._answers.append(message)
                self._changed.notify_all()
        with self._changed:
            self._answers.append({"error": "the zygote ended"})
            self._changed.notify_all()

    def alive(self) -> bool:
        return self._proc.poll() is None

    def spawn(self, args: list[str], env: dict[str, str], cwd: str, log: str) -> Forked:
        assert self._proc.stdin is not None
        request = json.dumps({"args": args, "env": env, "cwd": cwd, "log": log}).encode() + b"\n"
        with self._lock:
            self._proc.stdin.write(request)
            self._proc.stdin.flush()
            with self._changed:
                self._changed.wait_for(lambda: bool(self._answers), timeout=60)
                answer = self._answers.pop(0) if self._answers else {"error": "no answer in 60 s"}
        if "pid" not in answer:
            raise RuntimeError(f"the zygote could not start chatgate: {answer.get('error')}")
        return Forked(self, int(answer["pid"]))

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._exits, timeout=timeout)
            return self._exits.get(pid)

    def close(self) -> None:
        """Kills what it forked and still runs, then ends."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


_ZYGOTE: Zygote | None = None
_ZYGOTE_LOCK = threading.Lock()


def zygote(root: str) -> Zygote:
    """This test process's zygote (a new one if the last has ended)."""
    global _ZYGOTE
    with _ZYGOTE_LOCK:
        if _ZYGOTE is None or not _ZYGOTE.alive():
            _ZYGOTE = Zygote(root)
            atexit.register(_ZYGOTE.close)
        return _ZYGOTE


if __name__ == "__main__":
    sys.exit(main())
