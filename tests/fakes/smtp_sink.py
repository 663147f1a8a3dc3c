"""A real SMTP server (`aiosmtpd`) that keeps what it is given: where the email channel's
answers go in the tests. AUTH PLAIN/LOGIN without TLS (127.0.0.1 only), one login."""

from __future__ import annotations

import email
import email.policy
import threading
from dataclasses import dataclass, field
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from tests.support.servers import free_port
from tests.support.timing import eventually


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    raw: bytes
    login: str | None

    @property
    def message(self) -> EmailMessage:
        parsed = email.message_from_bytes(self.raw, policy=email.policy.default)
        assert isinstance(parsed, EmailMessage)
        return parsed


@dataclass
class SmtpSink:
    user: str = "bot"
    password: str = "smtp-secret"
    received: list[Received] = field(default_factory=list)
    logins: list[str] = field(default_factory=list)
    port: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _controller: Controller | None = None

    # --- aiosmtpd's handler and authenticator ---

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        login = session.auth_data.login.decode() if session.auth_data is not None else None
        item = Received(envelope.mail_from, tuple(envelope.rcpt_tos), bytes(envelope.original_content), login)
        with self._lock:
            self.received.append(item)
        return "250 OK"

    def _authenticate(
        self, server: Any, session: Any, envelope: Any, mechanism: str, data: Any
    ) -> AuthResult:
        if (
            isinstance(data, LoginPassword)
            and data.login.decode() == self.user
            and data.password.decode() == self.password
        ):
            with self._lock:
                self.logins.append(self.user)
            return AuthResult(success=True, auth_data=data)
        return AuthResult(success=False, handled=False)

    # --- lifecycle ---

    def __enter__(self) -> SmtpSink:
        self.port = free_port()
        self._controller = Controller(
            self,
            hostname="127.0.0.1",
            port=self.port,
            authenticator=self._authenticate,
            auth_require_tls=False,
            decode_data=False,
        )
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._controller is not None:
            self._controller.stop()

    async def wait_for(self, count: int, timeout: float = 20) -> list[Received]:
        await eventually(lambda: len(self.received) >= count, timeout, message=f"{count} mails not sent")
        return list(self.received)
