"""The `chatgate` command as a user runs it: a subprocess on a SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(args: list[str], db: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_migrate_chat_and_sessions(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    migrated = _run(["migrate"], db)
    assert migrated.returncode == 0, migrated.stderr
    assert "newest migration" in migrated.stdout

    chat = _run(["chat", "--chat", "alice"], db, stdin="hello\nwhat time is it?\n")
    assert chat.returncode == 0, chat.stderr
    assert "session cli:alice" in chat.stdout
    assert "bot> You said: hello" in chat.stdout
    assert "bot> It is " in chat.stdout

    listing = _run(["sessions", "list"], db)
    sessions = json.loads(listing.stdout)
    assert [(s["key"], s["message_count"]) for s in sessions] == [("cli:alice", 6)]

    show = _run(["sessions", "show", "cli:alice", "--runs"], db)
    detail = json.loads(show.stdout)
    assert [m["role"] for m in detail["messages"]] == [
        "user",
        "assistant",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert len(detail["run_traces"]) == 2
    assert {r["outcome"] for r in detail["run_traces"]} == {"ok"}

    reset = _run(["sessions", "reset", "cli:alice"], db)
    assert reset.returncode == 0 and "queued" in reset.stdout
    again = _run(["chat", "--chat", "alice"], db, stdin="how many messages are in this session?\n")
    assert "has 2 messages" in again.stdout  # the reset was applied before this turn

    missing = _run(["sessions", "show", "cli:nobody"], db)
    assert missing.returncode == 1 and "no session" in missing.stderr


def test_serve_freezes_what_start_up_built(tmp_path: Path) -> None:
    # `chatgate serve` freezes the objects of start-up (modules, the app) before it hands
    # over to uvicorn, so full GC passes under load do not rescan them. uvicorn.run is
    # replaced by a probe in this subprocess only.
    probe = (
        "import gc, uvicorn\n"
        "from app import cli\n"
        "uvicorn.run = lambda *a, **k: print('frozen', gc.get_freeze_count())\n"
        "cli.main(['serve'])\n"
    )
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}", "LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    frozen = int(done.stdout.split()[-1])
    assert frozen > 10_000, done.stdout
