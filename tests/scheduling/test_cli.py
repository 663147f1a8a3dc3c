"""`chatgate cron list|add|remove` as a real process against a SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.servers import ROOT


def chatgate(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{db}", "LOG_LEVEL": "WARNING"}
    return subprocess.run(
        [sys.executable, "-m", "app", "cron", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_add_list_remove(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    added = chatgate(
        db,
        "add",
        "--schedule",
        "0 9 * * 1-5",
        "--tz",
        "Asia/Shanghai",
        "--prompt",
        "stand-up",
        "--channel",
        "webhook",
        "--chat",
        "team",
    )
    assert added.returncode == 0, added.stderr
    job = json.loads(added.stdout)
    assert (job["schedule"], job["timezone"], job["source_session_key"]) == (
        "0 9 * * 1-5",
        "Asia/Shanghai",
        "webhook:team",
    )
    assert job["next_fire_at"].endswith("T01:00:00+00:00")
    assert job["created_by"] == "cli"

    once = chatgate(
        db,
        "add",
        "--at",
        "2099-01-01T08:00",
        "--prompt",
        "p",
        "--channel",
        "webhook",
        "--chat",
        "x",
        "--thread",
        "t",
    )
    assert once.returncode == 0, once.stderr
    assert json.loads(once.stdout)["next_fire_at"] == "2099-01-01T08:00:00+00:00"

    listed = chatgate(db, "list")
    assert listed.returncode == 0, listed.stderr
    assert [j["id"] for j in json.loads(listed.stdout)] == [job["id"], json.loads(once.stdout)["id"]]

    removed = chatgate(db, "remove", str(job["id"]))
    assert removed.returncode == 0, removed.stderr
    assert [j["id"] for j in json.loads(chatgate(db, "list").stdout)] == [json.loads(once.stdout)["id"]]
    again = chatgate(db, "remove", str(job["id"]))
    assert again.returncode == 1 and "no cron job" in again.stderr


def test_bad_input_is_refused_with_a_reason(tmp_path: Path) -> None:
    db = tmp_path / "cli.db"
    base = ["add", "--prompt", "p", "--channel", "webhook", "--chat", "c"]
    cases = [
        (["--schedule", "0 9 * *"], "5 fields"),
        (["--at", "2000-01-01T00:00", "--tz", "Atlantis/Capital"], "time zone"),
    ]
    for extra, reason in cases:
        result = chatgate(db, *base, *extra)
        assert result.returncode == 2, (extra, result.stdout, result.stderr)
        assert reason in result.stderr, (extra, result.stderr)
    unknown = chatgate(
        db, "add", "--schedule", "* * * * *", "--prompt", "p", "--channel", "fax", "--chat", "c"
    )
    assert unknown.returncode == 2 and "unknown target channel" in unknown.stderr
    assert json.loads(chatgate(db, "list").stdout) == []
