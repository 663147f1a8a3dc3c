"""A fresh checkout's first run: `chatgate serve --first-run` and the README's commands.

The server runs as a subprocess in an empty directory (no `.env`, no secrets file): the
README's "Talk to it" shell blocks then run as written (they follow `PORT`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import httpx
import pytest
import websockets

from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent

pytestmark = pytest.mark.slow

SECRET_NAMES = ("WEBHOOK_SECRET", "ADMIN_TOKEN", "GATEWAY_TOKENS", "GATEWAY_TOKEN_SECRET", "DATABASE_URL")


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in SECRET_NAMES and k not in ("HOST", "PORT")}
    return {**env, "LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1", **extra}


def _readme_blocks() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Talk to it") : readme.index("## Configuration")]
    return re.findall(r"```sh\n(.*?)```", section, flags=re.S)


def _wait_for_banner(proc: subprocess.Popen[str], deadline: float) -> list[str]:
    assert proc.stdout is not None
    lines: list[str] = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if line.startswith("  API docs:"):
            return lines
    proc.kill()
    raise AssertionError("no start-up banner:\n" + "\n".join(lines))


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """An empty working directory with `.venv` pointing at this interpreter's venv."""
    if not (VENV / "bin" / "chatgate").exists():
        pytest.skip("needs the chatgate entry point of an installed venv")
    (tmp_path / ".venv").symlink_to(VENV)
    return tmp_path


def test_first_run_turns_everything_on_and_the_readme_commands_work(checkout: Path) -> None:
    port = free_port()
    env = _clean_env(PORT=str(port))
    proc = subprocess.Popen(
        [str(checkout / ".venv/bin/chatgate"), "serve", "--first-run"],
        cwd=checkout,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        banner = _wait_for_banner(proc, time.monotonic() + 60)
        text = "\n".join(banner)
        base = f"http://127.0.0.1:{port}"
        assert f"chatgate is serving on {base}" in text
        assert "webhook:      on" in text and "admin API:    on" in text and "browser chat: on" in text
        token = re.search(r"chat page:    \S+/#token=(\S+)", text)
        assert token is not None
        assert f"dashboard:    {base}/admin" in text

        # The chat page's token works on the browser gateway: auth, attach, an answer.
        async def browser_chat() -> str:
            async with websockets.connect(f"ws://127.0.0.1:{port}/ws") as ws:
                await ws.send(json.dumps({"type": "auth", "token": unquote(token.group(1))}))
                authed = json.loads(await ws.recv())
                assert authed["type"] == "authenticated", authed
                await ws.send(json.dumps({"type": "attach", "session_key": authed["session_keys"][0]}))
                assert json.loads(await ws.recv())["type"] == "ready"
                await ws.send(json.dumps({"type": "send", "text": "hi there", "client_message_id": "m-1"}))
                while True:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 30))
                    if frame.get("type") == "message" and frame.get("role") == "assistant":
                        return str(frame["content"])

        assert asyncio.run(browser_chat()) == "You said: hi there"

        secrets = checkout / ".chatgate" / "secrets.env"
        assert secrets.stat().st_mode & 0o777 == 0o600
        assert (checkout / ".chatgate" / ".gitignore").read_text() == "*\n"
        assert token.group(1) in secrets.read_text()

        script = "set -e\n" + "\n".join(_readme_blocks())  # PORT in env: the snippets follow it
        run = subprocess.run(
            ["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode in (0, 1), run.stderr  # doctor may fail only on what it reports
        out = run.stdout
        assert '"session_key":"webhook:c1"' in out and "You said: hello" in out
        assert re.search(r"^webhook:c1\s+active\s+2\s", out, flags=re.M), out
        assert '"role":"assistant"' in out.replace(" ", "")  # the admin API answered
        assert "ok    schema: at head" in out
        assert "ok    secret ADMIN_TOKEN: set" in out and "ok    channel webhook: settings complete" in out
        assert "FAIL" not in out and run.returncode == 0, out
        assert "backlog:  inbox_pending=0" in out
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    # The second run keeps the secrets of the first.
    before = secrets.read_text()
    port = free_port()
    again = subprocess.Popen(
        [str(checkout / ".venv/bin/chatgate"), "serve", "--first-run"],
        cwd=checkout,
        env=_clean_env(PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert f"#token={token.group(1)}" in "\n".join(_wait_for_banner(again, time.monotonic() + 60))
        assert secrets.read_text() == before
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
    finally:
        again.terminate()
        again.wait(timeout=30)


def test_beyond_loopback_without_explicit_secrets_refuses_to_start(checkout: Path) -> None:
    run = subprocess.run(
        [str(checkout / ".venv/bin/chatgate"), "serve", "--first-run", "--host", "0.0.0.0"],
        cwd=checkout,
        env=_clean_env(PORT=str(free_port())),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert run.stderr.strip() == (
        "chatgate: refusing to serve on 0.0.0.0 without explicit secrets: set ADMIN_TOKEN, "
        "WEBHOOK_SECRET (environment or .env), or bind to 127.0.0.1 for a local first run"
    )
    assert not (checkout / ".chatgate").exists()
    assert not list(checkout.glob("*.db"))  # refused before touching anything


def test_plain_serve_generates_nothing(checkout: Path) -> None:
    """What the suite's server processes run: no secrets file is made or read."""
    port = free_port()
    proc = subprocess.Popen(
        [str(checkout / ".venv/bin/chatgate"), "serve"],
        cwd=checkout,
        env=_clean_env(PORT=str(port)),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        text = "\n".join(_wait_for_banner(proc, time.monotonic() + 60))
        assert "webhook:      off" in text and "admin API:    off" in text and "browser chat: off" in text
        assert "#token=" not in text
        assert httpx.get(f"http://127.0.0.1:{port}/admin/api/sessions", timeout=5).status_code == 503  # off
        assert not (checkout / ".chatgate").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
