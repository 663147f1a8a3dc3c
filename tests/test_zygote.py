"""The tests' `chatgate serve` processes are forked from a preloaded interpreter
(`tests/support/zygote.py`). These check that such a process is what `python -m app serve`
would be: the test's environment, its own exit status and signals, nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN
from tests.support.servers import BANNER, ROOT, ServerProcess
from tests.support.timing import eventually
from tests.support.zygote import Zygote

# Who reads which variable while the preloaded modules are imported: a stand-in for
# `os.environ` notes the reader's file (the nearest frame outside `os` and `collections.abc`).
_RECORD = """
import collections.abc, importlib, json, os, sys, traceback
read = []
class Recording(collections.abc.MutableMapping):
    def __init__(self, inner): self.inner = inner
    def __getitem__(self, key):
        for frame in reversed(traceback.extract_stack()[:-1]):
            if not frame.filename.endswith(("/os.py", "_collections_abc>", "/_collections_abc.py")):
                read.append((key, frame.filename))
                break
        return self.inner[key]
    def __setitem__(self, key, value): self.inner[key] = value
    def __delitem__(self, key): del self.inner[key]
    def __iter__(self): return iter(self.inner)
    def __len__(self): return len(self.inner)
os.environ = Recording(os.environ)
from tests.support.zygote import PRELOAD
for name in PRELOAD:
    importlib.import_module(name)
print(json.dumps(read))
"""


def test_nothing_preloaded_reads_the_environment_at_import() -> None:
    # A variable read by our code at import would keep the zygote's value in every forked
    # server. (Libraries copying the whole environment, as `platform` does for a subprocess,
    # keep nothing of it.)
    out = subprocess.run(
        [sys.executable, "-c", _RECORD],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": "sqlite+aiosqlite:///unused.db"},
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    read = [tuple(pair) for pair in json.loads(out.stdout.strip().splitlines()[-1])]
    assert any(key == "PATH" for key, _ in read)  # the recording works
    ours = [(key, file) for key, file in read if file.startswith((f"{ROOT}/app/", f"{ROOT}/channels/"))]
    assert ours == []


def _env(db: Path, **extra: str) -> dict[str, str]:
    return {"DATABASE_URL": f"sqlite+aiosqlite:///{db}", "ADMIN_TOKEN": ADMIN_TOKEN, "CHANNELS": "", **extra}


def test_a_forked_server_has_the_tests_environment_and_its_own_exit_status(tmp_path: Path) -> None:
    first = ServerProcess(_env(tmp_path / "first.db")).start()
    second = ServerProcess(_env(tmp_path / "second.db")).start()
    try:
        assert first.proc is not None and second.proc is not None
        assert first.proc.pid != second.proc.pid != os.getpid()
        # Each migrated the database its own environment names, and serves its own port.
        assert (tmp_path / "first.db").exists() and (tmp_path / "second.db").exists()
        for server in (first, second):
            assert httpx.get(f"{server.url}/readyz", timeout=5).status_code == 200
        # SIGTERM: the hand-over runs and the process ends with 0; SIGKILL: -9, as Popen says.
        first.terminate()
        assert first.wait(30) == 0
        second.kill()
        assert second.proc.returncode == -signal.SIGKILL
    finally:
        first.kill()
        second.kill()


def test_a_forked_server_refusing_its_configuration_exits_2_with_the_reason(tmp_path: Path) -> None:
    server = ServerProcess(_env(tmp_path / "bad.db", CHANNELS="no-such-channel"))
    with pytest.raises(RuntimeError, match="server exited early") as refused:
        server.start(timeout=30)
    assert "configuration error" in str(refused.value)
    assert server.proc is not None and server.proc.returncode == 2


async def test_the_zygote_ending_kills_what_it_forked(tmp_path: Path) -> None:
    zygote = Zygote(str(ROOT))
    log = tmp_path / "server.log"
    env = {**os.environ, **_env(tmp_path / "orphan.db")}
    forked = zygote.spawn(["serve", "--host", "127.0.0.1", "--port", "0"], env, str(ROOT), str(log))
    try:
        await eventually(lambda: BANNER in (log.read_text() if log.exists() else ""), timeout=60)
        assert forked.poll() is None
    finally:
        await asyncio.to_thread(zygote.close)
    # Gone, not a zombie (signal 0 reaches a zombie): the zygote killed and reaped it.
    with pytest.raises(ProcessLookupError):
        os.kill(forked.pid, 0)
