"""Helpers of the email tests: settings pointing at the test's servers, mails to deliver."""

from __future__ import annotations

import uuid
from email.message import EmailMessage
from email.utils import formatdate
from typing import Any

from sqlalchemy import select

from app.db.models import connection_leases
from channels.email import EmailSettings
from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot


def email_settings(imap: Dovecot, address: str, smtp: SmtpSink, **overrides: Any) -> EmailSettings:
    values: dict[str, Any] = dict(
        address=address,
        imap_host="127.0.0.1",
        imap_port=imap.port,
        imap_security="none",
        password=imap.users[address],
        smtp_host="127.0.0.1",
        smtp_port=smtp.port,
        smtp_security="none",
        smtp_user=smtp.user,
        smtp_password=smtp.password,
        process_existing=True,
        retry_seconds=0.2,
        timeout_seconds=10,
    )
    values.update(overrides)
    return EmailSettings(_env_file=None, **values)  # type: ignore[call-arg]


def email_env(imap: Dovecot, address: str, smtp: SmtpSink) -> dict[str, str]:
    """The same settings as a server process's environment."""
    return {
        "EMAIL_ADDRESS": address,
        "EMAIL_IMAP_HOST": "127.0.0.1",
        "EMAIL_IMAP_PORT": str(imap.port),
        "EMAIL_IMAP_SECURITY": "none",
        "EMAIL_PASSWORD": imap.users[address],
        "EMAIL_SMTP_HOST": "127.0.0.1",
        "EMAIL_SMTP_PORT": str(smtp.port),
        "EMAIL_SMTP_SECURITY": "none",
        "EMAIL_SMTP_USER": smtp.user,
        "EMAIL_SMTP_PASSWORD": smtp.password,
        "EMAIL_PROCESS_EXISTING": "true",
        "EMAIL_RETRY_SECONDS": "0.2",
    }


def mail(
    to: str,
    text: str,
    *,
    sender: str = "alice@example.com",
    subject: str = "A question",
    message_id: str | None = None,
    in_reply_to: str | None = None,
    references: list[str] | None = None,
    html: str | None = None,
    headers: dict[str, str] | None = None,
    attachments: list[tuple[str, str, bytes]] = (),  # type: ignore[assignment]
) -> EmailMessage:
    message = EmailMessage()
    message["From"] = f"Alice <{sender}>"
    message["To"] = to
    message["Subject"] = subject
    message["Date"] = formatdate()
    message["Message-ID"] = f"<{message_id or uuid.uuid4().hex + '@example.com'}>"
    if in_reply_to:
        message["In-Reply-To"] = f"<{in_reply_to}>"
    if references:
        message["References"] = " ".join(f"<{r}>" for r in references)
    for name, value in (headers or {}).items():
        message[name] = value
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
    for name, mime, data in attachments:
        maintype, _, subtype = mime.partition("/")
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message


def message_id_of(message: EmailMessage) -> str:
    return str(message["Message-ID"]).strip().strip("<>")


async def saved_position(engine: Any) -> dict[str, Any] | None:
    """What the mailbox's holder saved in its lease row (UIDVALIDITY, last UID)."""
    async with engine.connect() as conn:
        state = (
            await conn.execute(
                select(connection_leases.c.state).where(connection_leases.c.name.like("email:%"))
            )
        ).scalar()
    return state if isinstance(state, dict) else None
