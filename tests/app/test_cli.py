"""The `chatgate` command as a user runs it: a subprocess on a SQLite file."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, WEBHOOK_SECRET, ServeApp
from tests.support.timing import scaled
from tests.support.webhook import post_webhook

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


def test_help_lists_every_command_without_loading_the_database_layer(tmp_path: Path) -> None:
    """Every `chatgate` start builds all commands' parsers: that must not import what only
    some commands use (SQLAlchemy, the access gate, the memory package: 430 modules and a
    second of CPU on a slow machine, before the command had done anything)."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'x.db'}", "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "app", "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for command in ("serve", "migrate", "sessions", "cron", "dead-letters", "access", "memory", "doctor"):
        assert command in done.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if "|" in line}
    assert "app.cli" in imported
    assert not {"sqlalchemy", "app.access.gate", "app.memory.store", "httpx"} & imported


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

    listing = _run(["sessions", "list", "--json"], db)
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
    # over to uvicorn, so full GC passes under load do not rescan them. uvicorn's
    # Server.run is replaced by a probe in this subprocess only.
    probe = (
        "import gc, uvicorn\n"
        "from app import cli\n"
        "uvicorn.Server.run = lambda *a, **k: print('frozen', gc.get_freeze_count())\n"
        "cli.main(['serve'])\n"
    )
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'serve.db'}", "LOG_LEVEL": "WARNING"}
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert "frozen" in done.stdout, done.stderr
    frozen = int(done.stdout.split()[-1])
    assert frozen > 10_000, done.stdout


# --- the CLI that helps (issue 22) ------------------------------------------------------

CLEAN = ("WEBHOOK_SECRET", "ADMIN_TOKEN", "GATEWAY_TOKENS", "GATEWAY_TOKEN_SECRET", "LLM_PROVIDER")


def _cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    timeout = float(env.pop("timeout", "60"))
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    return subprocess.run(
        [sys.executable, "-m", "app", *args],
        cwd=cwd,
        env={**base, "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING", **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_version(tmp_path: Path) -> None:
    done = _cli(["--version"], tmp_path)
    assert done.returncode == 0
    assert re.fullmatch(r"chatgate \d+\.\d+\.\d+\S*\n", done.stdout)


def test_a_bad_token_setting_is_named_but_never_quoted(tmp_path: Path) -> None:
    secret = "short-secret-x"
    for setting, value in (
        ("OPENAI_API_TOKENS", f'{{"{secret}": "caller"}}'),
        ("OPENAI_API_TOKENS", secret),
        ("A2A_TOKENS", f"{secret}=caller"),
    ):
        done = _cli(["serve", "--port", "9"], tmp_path, **{setting: value})
        assert done.returncode == 2
        assert setting in done.stderr
        assert secret not in done.stderr


def test_a_configuration_error_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    done = _cli(["status"], tmp_path, LLM_PROVIDER="opnai")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "chatgate: configuration error: LLM_PROVIDER: Input should be 'offline' or 'openai' (got 'opnai')\n"
    )


def test_a_database_that_does_not_exist_fails_fast_with_the_reason(tmp_path: Path) -> None:
    url = "postgresql://postgres@127.0.0.1:5432/chatgate_no_such_database"
    start = time.monotonic()
    done = _cli(["serve", "--port", "9"], tmp_path, DATABASE_URL=url, DB_CONNECT_RETRY_SECONDS="30")
    assert time.monotonic() - start < 20  # not the 30 s of a database that is starting up
    assert done.returncode == 2
    assert done.stderr == (
        "chatgate: database unusable: the database does not exist: "
        'database "chatgate_no_such_database" does not exist\n'
    )
    migrate = _cli(["migrate"], tmp_path, DATABASE_URL=url)
    assert migrate.returncode == 2 and migrate.stderr == done.stderr


def test_wrong_credentials_fail_fast_with_the_reason(tmp_path: Path) -> None:
    url = "postgresql://nobody_here:wrong@127.0.0.1:5432/postgres"
    done = _cli(["chat"], tmp_path, DATABASE_URL=url, DB_CONNECT_RETRY_SECONDS="30", timeout="25")
    assert done.returncode == 2
    assert done.stderr.startswith("chatgate: database unusable: the ")
    assert "Traceback" not in done.stderr and len(done.stderr.splitlines()) == 1


def test_doctor_names_each_check_and_fails_until_all_pass(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'doc.db'}"
    fresh = _cli(["doctor"], tmp_path, DATABASE_URL=db)
    assert fresh.returncode == 1
    lines = fresh.stdout.splitlines()
    assert lines[0] == "ok    database: reachable (sqlite)"
    assert lines[1].startswith("FAIL  schema: at nothing, head is ")
    assert "FAIL  channel webhook: unset: WEBHOOK_SECRET" in lines
    assert "ok    model: offline provider (built in, no endpoint)" in lines
    assert "FAIL  secret ADMIN_TOKEN: unset: the admin API and dashboard are off" in lines
    assert any(line.startswith("ok    clock: ") for line in lines)

    assert _cli(["migrate"], tmp_path, DATABASE_URL=db).returncode == 0
    secrets = {"WEBHOOK_SECRET": "s" * 20, "ADMIN_TOKEN": "a" * 20, "GATEWAY_TOKEN_SECRET": "g" * 20}
    good = _cli(["doctor", "--json"], tmp_path, DATABASE_URL=db, **secrets)
    assert good.returncode == 0, good.stdout
    checks = json.loads(good.stdout)
    assert {c["check"] for c in checks} >= {"database", "schema", "channel webhook", "model", "clock"}
    assert all(c["ok"] for c in checks)

    unreachable = _cli(["doctor"], tmp_path, DATABASE_URL=db, LLM_PROVIDER="openai", **secrets)
    assert unreachable.returncode == 1
    assert (
        "FAIL  model: LLM_PROVIDER=openai needs LLM_API_KEY (for api.openai.com) or LLM_BASE_URL "
        "(a local endpoint)" in unreachable.stdout.splitlines()
    )
    refused = _cli(["serve", "--port", "9"], tmp_path, DATABASE_URL=db, LLM_PROVIDER="openai", **secrets)
    assert refused.returncode == 2
    assert refused.stderr.startswith("chatgate: configuration error: LLM_PROVIDER=openai needs LLM_API_KEY")


def test_status_shows_backlog_and_sessions_as_a_table_or_json(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'st.db'}"
    assert _cli(["migrate"], tmp_path, DATABASE_URL=db).returncode == 0
    table = _cli(["status"], tmp_path, DATABASE_URL=db)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1].startswith("backlog:  inbox_pending=0")
    data = json.loads(_cli(["status", "--json"], tmp_path, DATABASE_URL=db).stdout)
    assert data["database"] == "sqlite" and data["workers"] == []


def test_memory_commands_are_in_the_same_cli(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'mem.db'}"
    assert _cli(["migrate"], tmp_path, DATABASE_URL=db).returncode == 0
    added = _cli(["memory", "global", "add", "The office is closed on Sundays."], tmp_path, DATABASE_URL=db)
    assert added.returncode == 0 and added.stdout == "stored\n"
    listed = _cli(["memory", "global", "list"], tmp_path, DATABASE_URL=db)
    assert listed.stdout.endswith("\toperator\tThe office is closed on Sundays.\n")


def test_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'pipe.db'}"
    base = {k: v for k, v in os.environ.items() if k not in CLEAN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "doctor"],
        cwd=tmp_path,
        env={**base, "PYTHONPATH": str(ROOT), "DATABASE_URL": db},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before the first line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141
    assert err == ""


def _ctrl_c_as_at_a_terminal() -> None:
    """A shell ignores SIGINT in what it starts in the background (`make test &`), and the
    child inherits that: Python then raises no KeyboardInterrupt. A user's Ctrl-C reaches a
    chat started at a terminal; so it does here, however the suite itself was started."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class _Interactive:
    """`chatgate chat` in a subprocess with its output collected as it comes."""

    def __init__(self, cwd: Path, **env: str) -> None:
        base = {k: v for k, v in os.environ.items() if k not in CLEAN}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app", "chat", "--chat", "carol"],
            cwd=cwd,
            env={**base, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **env},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=_ctrl_c_as_at_a_terminal,
        )
        self.out = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        while chunk := self.proc.stdout.read(1):
            self.out += chunk

    def wait_for(self, text: str, timeout: float = 60, *, after: int = 0) -> None:
        """Until `text` shows in the output from position `after` on (a prompt printed
        again is not the one already there)."""
        deadline = time.monotonic() + scaled(timeout)
        while text not in self.out[after:]:
            assert time.monotonic() < deadline, f"{text!r} not in {self.out!r}"
            time.sleep(0.05)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()


def test_chat_ctrl_c_stops_the_answer_then_quits_cleanly_and_help_is_a_command(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'chat.db'}"
    chat = _Interactive(tmp_path, DATABASE_URL=db, OFFLINE_LATENCY_MS="20000")
    chat.wait_for("you> ")
    chat.send("hello")
    time.sleep(1.5)  # the offline model takes 20 s: the answer is still being made
    chat.proc.send_signal(signal.SIGINT)
    chat.wait_for("(stopped)\nbot> ")  # and /stop was sent: the run ends too
    chat.wait_for("you> ", timeout=30, after=chat.out.index("(stopped)"))
    start = len(chat.out)
    chat.send("/help")
    chat.wait_for("/approve", after=start)  # the command registry answered, not the model (20 s)
    assert "/new" in chat.out[start:] and "You said" not in chat.out
    # The prompt after the answer: a Ctrl-C before it would stop the answer, not quit.
    chat.wait_for("you> ", after=start)
    before = chat.out.count("you> ")
    time.sleep(0.3)
    chat.proc.send_signal(signal.SIGINT)  # at the prompt: quit
    assert chat.proc.wait(timeout=30) == 0
    assert chat.proc.stderr is not None
    assert "Traceback" not in chat.proc.stderr.read()
    assert chat.out.count("you> ") == before


async def test_doctor_asks_the_model_endpoint_and_compares_clocks(tmp_path: Path) -> None:
    from tests.fakes.openai_server import FakeOpenAI

    db = f"sqlite:///{tmp_path / 'model.db'}"
    assert (await asyncio.to_thread(_cli, ["migrate"], tmp_path, DATABASE_URL=db)).returncode == 0
    env = {"DATABASE_URL": db, "LLM_PROVIDER": "openai", "LLM_API_KEY": "sk-test"}
    async with FakeOpenAI() as fake:
        done = await asyncio.to_thread(_cli, ["doctor"], tmp_path, LLM_BASE_URL=fake.url, **env)
    lines = done.stdout.splitlines()
    assert f"ok    model: {fake.url}/models answered 200" in lines
    assert any(
        re.fullmatch(r"ok    clock: [+-]\d+ s from the model endpoint's clock", line) for line in lines
    )
    gone = await asyncio.to_thread(_cli, ["doctor"], tmp_path, LLM_BASE_URL=fake.url, **env)
    assert gone.returncode == 1
    assert any(
        line.startswith(f"FAIL  model: {fake.url}/models not answering") for line in gone.stdout.splitlines()
    )


def test_serve_names_a_misspelt_channel_and_an_unreachable_database_in_one_line(tmp_path: Path) -> None:
    secrets = {"WEBHOOK_SECRET": "s" * 20, "ADMIN_TOKEN": "a" * 20}
    typo = _cli(["serve", "--port", "9"], tmp_path, CHANNELS="webhook,telgram", **secrets)
    assert typo.returncode == 2
    assert typo.stderr.splitlines() == [
        "chatgate: configuration error: CHANNELS: unknown channel 'telgram' (did you mean 'telegram'?); "
        "known: " + ", ".join(__import__("channels").KNOWN_CHANNELS)
    ]
    down = _cli(
        ["serve", "--port", "9"],
        tmp_path,
        DATABASE_URL="postgresql://postgres@127.0.0.1:1/nothing",
        DB_CONNECT_RETRY_SECONDS="1",
        **secrets,
    )
    assert down.returncode == 2
    assert [line for line in down.stderr.splitlines() if line.startswith("chatgate:")] == [
        "chatgate: database unusable: not reachable after 1 s of retries: "
        "[Errno 111] Connect call failed ('127.0.0.1', 1)"
    ]
    assert "Traceback" not in down.stderr


async def test_status_reports_the_running_deployment_not_the_shell(
    serve: ServeApp, db_url: str, tmp_path: Path
) -> None:
    """From the database: the channels that had traffic (whatever CHANNELS the shell says);
    with --url: what the running server serves, with each channel's health."""
    async with serve() as srv, httpx.AsyncClient(timeout=60) as client:
        sent = await post_webhook(
            client, srv.url, WEBHOOK_SECRET, {"chat_id": "c", "sender_id": "u", "text": "hi"}, wait=True
        )
        assert sent.status_code == 200, sent.text
        env = {"DATABASE_URL": db_url, "CHANNELS": "telegram"}  # the shell's own idea
        local = await asyncio.to_thread(_cli, ["status", "--json"], tmp_path, **env)
        assert local.returncode == 0, local.stderr
        data = json.loads(local.stdout)
        assert [(c["channel"], c["inbound_last_hour"]) for c in data["channels"]] == [("webhook", 1)]
        remote = await asyncio.to_thread(
            _cli, ["status", "--url", srv.url, "--json"], tmp_path, ADMIN_TOKEN=ADMIN_TOKEN, **env
        )
        assert remote.returncode == 0, remote.stderr
        served = json.loads(remote.stdout)
        assert {c["channel"]: c["health"] for c in served["channels"]}["webhook"] == "ok"
        wrong = await asyncio.to_thread(
            _cli, ["status", "--url", srv.url], tmp_path, ADMIN_TOKEN="not-the-token-at-all", **env
        )
        assert wrong.returncode == 1
        assert wrong.stderr.startswith("chatgate: status: ") and "answered 401" in wrong.stderr


def test_chat_shows_the_answer_as_it_is_written(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'stream.db'}"
    chat = _Interactive(tmp_path, DATABASE_URL=db, OFFLINE_STREAM_DELAY_MS="400")
    chat.wait_for("you> ")
    chat.send("one two three four five six")
    chat.wait_for("bot> You")
    partial = chat.out
    assert "six" not in partial  # the first words are on screen before the last is written
    chat.wait_for("six\nyou> ")
    assert chat.out.count("bot> You said: one two three four five six\n") == 1  # completed, not repeated
    chat.proc.send_signal(signal.SIGINT)
    assert chat.proc.wait(timeout=30) == 0
