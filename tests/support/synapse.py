"""A real Matrix homeserver (Synapse) for the Matrix channel's tests.

Synapse is installed from PyPI into its own virtualenv on first use (its dependencies are
not ours to pin): `CHATGATE_SYNAPSE_VENV`, else `~/.cache/chatgate-test/synapse-venv`.
`scripts/test.sh` prepares it before the suite (`python -m tests.support.synapse`), so a
fresh machine has it; a lock file keeps two test workers from installing it at once.

`Synapse` starts one homeserver on a free port with a throw-away configuration (server name
`localhost`, SQLite, registration only through the shared secret, rate limits lifted,
no federation) and registers users through the shared-secret admin API. `MatrixUser` is the
human side of a test: a plain client-server API client (httpx) that creates rooms, invites
the bot, sends messages and reads what the bot wrote.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import httpx

from tests.support.servers import free_port

SERVER_NAME = "localhost"
SYNAPSE_PACKAGE = "matrix-synapse"
_LOOSE = {"per_second": 10000, "burst_count": 10000}


def venv_path() -> Path:
    given = os.environ.get("CHATGATE_SYNAPSE_VENV")
    if given:
        return Path(given)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "chatgate-test" / "synapse-venv"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _installed(venv: Path) -> bool:
    python = _python(venv)
    if not python.exists():
        return False
    probe = subprocess.run([str(python), "-c", "import synapse.app.homeserver"], capture_output=True)
    return probe.returncode == 0


def ensure_synapse() -> Path:
    """The Python of a virtualenv with Synapse, installing it on first use."""
    venv = venv_path()
    if _installed(venv):
        return _python(venv)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be installing it right now
        if not _installed(venv):
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(_python(venv)), "-m", "pip", "install", "-q", SYNAPSE_PACKAGE],
                check=True,
                timeout=900,
            )
    return _python(venv)


def _config(directory: Path, port: int, shared_secret: str) -> dict[str, Any]:
    return {
        "server_name": SERVER_NAME,
        "public_baseurl": f"http://127.0.0.1:{port}/",
        "pid_file": str(directory / "homeserver.pid"),
        "listeners": [
            {
                "port": port,
                "tls": False,
                "type": "http",
                "x_forwarded": False,
                "bind_addresses": ["127.0.0.1"],
                "resources": [{"names": ["client"], "compress": False}],
            }
        ],
        "database": {"name": "sqlite3", "args": {"database": str(directory / "homeserver.db")}},
        "media_store_path": str(directory / "media_store"),
        "signing_key_path": str(directory / "localhost.signing.key"),
        "registration_shared_secret": shared_secret,
        "enable_registration": False,
        "report_stats": False,
        "macaroon_secret_key": secrets.token_hex(16),
        "form_secret": secrets.token_hex(16),
        "trusted_key_servers": [],
        "suppress_key_server_warning": True,
        "federation_domain_whitelist": [],
        "bcrypt_rounds": 4,  # test passwords: hashing fast, not strong
        "enable_metrics": False,
        "presence": {"enabled": False},
        "url_preview_enabled": False,
        "max_upload_size": "50M",
        # Tests send in bursts: no rate limit may slow them down.
        "rc_message": _LOOSE,
        "rc_registration": _LOOSE,
        "rc_login": {"address": _LOOSE, "account": _LOOSE, "failed_attempts": _LOOSE},
        "rc_joins": {"local": _LOOSE, "remote": _LOOSE},
        "rc_joins_per_room": _LOOSE,
        "rc_invites": {"per_room": _LOOSE, "per_user": _LOOSE, "per_issuer": _LOOSE},
        "rc_admin_redaction": _LOOSE,
        "rc_3pid_validation": _LOOSE,
        "rc_media_create": _LOOSE,
    }


class Synapse:
    """One homeserver process with a throw-away configuration and database."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="chatgate-synapse-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.shared_secret = secrets.token_hex(16)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 90.0) -> Synapse:
        python = ensure_synapse()
        config = self.directory / "homeserver.yaml"
        # JSON is YAML: the whole configuration is written here, none generated to edit.
        config.write_text(json.dumps(_config(self.directory, self.port, self.shared_secret), indent=1))
        subprocess.run(
            [str(python), "-m", "synapse.app.homeserver", "-c", str(config), "--generate-keys"],
            check=True,
            capture_output=True,
            cwd=self.directory,
        )
        log = (self.directory / "synapse.log").open("ab")
        self.proc = subprocess.Popen(
            [str(python), "-m", "synapse.app.homeserver", "-c", str(config)],
            cwd=self.directory,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"synapse exited early:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return self
            time.sleep(0.2)
        said = self.log()
        self.stop()
        raise RuntimeError(f"synapse did not start:\n{said}")

    def log(self) -> str:
        path = self.directory / "synapse.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None
        shutil.rmtree(self.directory, ignore_errors=True)

    def register(self, prefix: str) -> tuple[str, str]:
        """A new user (shared-secret admin API): (user id, access token)."""
        username = f"{prefix}{uuid.uuid4().hex[:8]}"
        password = secrets.token_hex(8)
        endpoint = f"{self.url}/_synapse/admin/v1/register"
        nonce = httpx.get(endpoint, timeout=10).json()["nonce"]
        mac = hmac.new(self.shared_secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), username.encode(), password.encode(), b"notadmin"]))
        body = {
            "nonce": nonce,
            "username": username,
            "password": password,
            "admin": False,
            "mac": mac.hexdigest(),
        }
        answer = httpx.post(endpoint, json=body, timeout=30)
        answer.raise_for_status()
        data = answer.json()
        return str(data["user_id"]), str(data["access_token"])


def _q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class MatrixUser:
    """A person on the homeserver, through the client-server API."""

    def __init__(self, base_url: str, user_id: str, token: str) -> None:
        self.user_id = user_id
        self.http = httpx.AsyncClient(
            base_url=f"{base_url}/_matrix/client/v3",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> dict[str, Any]:
        answer = await self.http.request(method, path, json=body, params=params or None)
        answer.raise_for_status()
        data: dict[str, Any] = answer.json()
        return data

    async def create_room(self, invite: list[str], *, encrypted: bool = False, direct: bool = True) -> str:
        body: dict[str, Any] = {"invite": invite, "is_direct": direct, "preset": "private_chat"}
        if encrypted:
            body["initial_state"] = [
                {
                    "type": "m.room.encryption",
                    "state_key": "",
                    "content": {"algorithm": "m.megolm.v1.aes-sha2"},
                }
            ]
        return str((await self._call("POST", "/createRoom", body))["room_id"])

    async def join(self, room_id: str) -> None:
        await self._call("POST", f"/join/{_q(room_id)}", {})

    async def invite(self, room_id: str, user_id: str) -> None:
        await self._call("POST", f"/rooms/{_q(room_id)}/invite", {"user_id": user_id})

    async def send(self, room_id: str, content: dict[str, Any], event_type: str = "m.room.message") -> str:
        path = f"/rooms/{_q(room_id)}/send/{_q(event_type)}/{uuid.uuid4().hex}"
        return str((await self._call("PUT", path, content))["event_id"])

    async def say(self, room_id: str, text: str, *, thread: str | None = None) -> str:
        content: dict[str, Any] = {"msgtype": "m.text", "body": text}
        if thread is not None:
            content["m.relates_to"] = {"rel_type": "m.thread", "event_id": thread, "is_falling_back": True}
        return await self.send(room_id, content)

    async def edit(self, room_id: str, event_id: str, text: str) -> str:
        """Edit the user's message `event_id` as clients do (`m.replace`, `m.new_content`)."""
        content = {
            "msgtype": "m.text",
            "body": f"* {text}",
            "m.new_content": {"msgtype": "m.text", "body": text},
            "m.relates_to": {"rel_type": "m.replace", "event_id": event_id},
        }
        return await self.send(room_id, content)

    async def react(self, room_id: str, event_id: str, key: str) -> str:
        relates = {"rel_type": "m.annotation", "event_id": event_id, "key": key}
        return await self.send(room_id, {"m.relates_to": relates}, "m.reaction")

    async def redact(self, room_id: str, event_id: str) -> str:
        path = f"/rooms/{_q(room_id)}/redact/{_q(event_id)}/{uuid.uuid4().hex}"
        return str((await self._call("PUT", path, {}))["event_id"])

    async def leave(self, room_id: str) -> None:
        await self._call("POST", f"/rooms/{_q(room_id)}/leave", {})

    async def event(self, room_id: str, event_id: str) -> dict[str, Any]:
        return await self._call("GET", f"/rooms/{_q(room_id)}/event/{_q(event_id)}")

    async def upload(self, data: bytes, content_type: str, filename: str) -> str:
        """Put `data` in the content repository; its `mxc://` URI."""
        answer = await self.http.post(
            str(self.http.base_url).replace("/_matrix/client/v3", "/_matrix/media/v3") + "upload",
            content=data,
            params={"filename": filename},
            headers={"Content-Type": content_type},
        )
        answer.raise_for_status()
        return str(answer.json()["content_uri"])

    async def download(self, mxc: str) -> bytes:
        server, media_id = mxc.removeprefix("mxc://").split("/", 1)
        base = str(self.http.base_url).replace("/_matrix/client/v3", "/_matrix/client/v1")
        answer = await self.http.get(f"{base}media/download/{_q(server)}/{_q(media_id)}")
        answer.raise_for_status()
        return answer.content

    async def events(self, room_id: str) -> list[dict[str, Any]]:
        """The room's timeline, oldest first (up to 500 events)."""
        data = await self._call("GET", f"/rooms/{_q(room_id)}/messages", dir="b", limit=500)
        return list(reversed(data.get("chunk") or []))

    async def members(self, room_id: str) -> list[str]:
        data = await self._call("GET", f"/rooms/{_q(room_id)}/joined_members")
        return list((data.get("joined") or {}).keys())


def final_texts(events: list[dict[str, Any]], sender: str) -> list[dict[str, Any]]:
    """The messages `sender` wrote, each as its last edit shows it (edits folded in)."""
    originals: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for event in events:
        if event.get("sender") != sender or event.get("type") != "m.room.message":
            continue
        content = event.get("content") or {}
        relates = content.get("m.relates_to") or {}
        if relates.get("rel_type") == "m.replace":
            target = originals.get(relates.get("event_id", ""))
            if target is not None:
                target["content"] = dict(
                    content.get("m.new_content") or {}, **{"m.relates_to": target["relates"]}
                )
                target["edits"] += 1
            continue
        originals[event["event_id"]] = {
            "event_id": event["event_id"],
            "content": content,
            "relates": relates,
            "edits": 0,
        }
        order.append(event["event_id"])
    return [originals[i] for i in order]


if __name__ == "__main__":  # `python -m tests.support.synapse`: install it now (scripts/test.sh)
    print(ensure_synapse())
