"""A real IMAP server (Debian's `dovecot-imapd`), started by a test on a free port.

A throw-away config in a directory of its own: IMAP on 127.0.0.1 only, plain logins
allowed without TLS, any user name with the server's one password (a fresh mailbox per
test: `add_user`), maildirs under the same directory. As root, Dovecot's login processes
must run as an unprivileged user (`dovenull`, its internal ones as `dovecot`) and mail as
another (`mail`); as anyone else, everything runs as that user.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aioimaplib

from tests.support.servers import free_port

DOVECOT = shutil.which("dovecot") or "/usr/sbin/dovecot"


def _users() -> tuple[str, str, str]:
    """(login user, internal user, mail user) to run Dovecot's processes as."""
    if os.geteuid() != 0:
        me = pwd.getpwuid(os.geteuid()).pw_name
        return me, me, me
    return "dovenull", "dovecot", "mail"


@dataclass
class Dovecot:
    home: Path
    port: int
    mail_user: str
    password: str
    process: subprocess.Popen[bytes] | None = None
    users: dict[str, str] = field(default_factory=dict)

    def add_user(self, domain: str = "example.org") -> tuple[str, str]:
        """A new, empty mailbox: (address, password)."""
        address = f"bot-{uuid.uuid4().hex[:10]}@{domain}"
        self.users[address] = self.password
        return address, self.password

    async def client(self, address: str) -> aioimaplib.IMAP4:
        client = aioimaplib.IMAP4("127.0.0.1", self.port, timeout=10)
        await client.wait_hello_from_server()
        response = await client.login(address, self.users[address])
        assert response.result == "OK", response
        return client

    async def append(self, address: str, raw: bytes, mailbox: str = "INBOX") -> None:
        """Deliver `raw` into the user's mailbox (IMAP APPEND, as a mail client or an MDA would)."""
        client = await self.client(address)
        try:
            response = await client.append(raw, mailbox=mailbox)
            assert response.result == "OK", response
        finally:
            await client.logout()

    async def flags(self, address: str) -> list[str]:
        """The FETCH FLAGS lines of every mail in the user's INBOX."""
        client = await self.client(address)
        try:
            await client.select("INBOX")
            response = await client.fetch("1:*", "(FLAGS)")
            return [bytes(x).decode() for x in response.lines if b"FETCH" in bytes(x)]
        finally:
            await client.logout()


def _configure() -> Dovecot:
    login_user, internal_user, mail_user = _users()
    home = Path(tempfile.mkdtemp(prefix="chatgate-dovecot-"))
    home.chmod(0o755)  # the login processes run as another user and reach the sockets in it
    (home / "mail").mkdir()
    port, password = free_port(), uuid.uuid4().hex
    entry = pwd.getpwnam(mail_user)
    os.chown(home / "mail", entry.pw_uid, entry.pw_gid)
    (home / "dovecot.conf").write_text(
        f"""
protocols = imap
listen = 127.0.0.1
base_dir = {home}/run
state_dir = {home}/state
log_path = {home}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
default_internal_user = {internal_user}
default_internal_group = {_group(internal_user)}
default_login_user = {login_user}
first_valid_uid = {min(entry.pw_uid, 500)}
first_valid_gid = {min(entry.pw_gid, 500)}
mail_location = maildir:{home}/mail/%u
passdb {{
  driver = static
  args = password={password}
}}
userdb {{
  driver = static
  args = uid={entry.pw_uid} gid={entry.pw_gid} home={home}/mail/%u
}}
service imap-login {{
  chroot =
  inet_listener imap {{
    address = 127.0.0.1
    port = {port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service anvil {{
  chroot =
}}
service stats {{
  unix_listener stats-reader {{
    user = {internal_user}
  }}
  unix_listener stats-writer {{
    user = {internal_user}
  }}
}}
"""
    )
    return Dovecot(home=home, port=port, mail_user=mail_user, password=password)


def _group(user: str) -> str:
    return grp.getgrgid(pwd.getpwnam(user).pw_gid).gr_name


@contextlib.contextmanager
def dovecot() -> Iterator[Dovecot]:
    """A running Dovecot (IMAP only); its directory is removed afterwards."""
    server = _configure()
    server.process = subprocess.Popen(
        [DOVECOT, "-F", "-c", str(server.home / "dovecot.conf")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            if server.process.poll() is not None:
                logged = server.home / "dovecot.log"
                log = logged.read_text(errors="replace") if logged.exists() else ""
                raise RuntimeError(f"dovecot exited: {log}")
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", server.port), timeout=1) as sock:
                    if sock.recv(64).startswith(b"* OK"):
                        break
            if time.monotonic() > deadline:
                raise RuntimeError("dovecot did not start listening")
            time.sleep(0.05)
        yield server
    finally:
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait()
        shutil.rmtree(server.home, ignore_errors=True)
