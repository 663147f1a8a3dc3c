"""`chatgate doctor`: the IMAP login (and the mailbox selected), then SMTP EHLO and AUTH, live."""

from __future__ import annotations

import aioimaplib
import aiosmtplib
import httpx

from app.probe import CredentialsRejected
from channels.email.mailbox import LoginRefused, Mailbox, MailboxError
from channels.email.settings import EmailSettings


async def probe(settings: EmailSettings, client: httpx.AsyncClient) -> str:
    if not settings.address:
        raise CredentialsRejected("EMAIL_ADDRESS unset")
    if not settings.imap_host:
        raise CredentialsRejected("EMAIL_IMAP_HOST unset")
    mailbox = Mailbox(settings)
    try:
        await mailbox.open()
        idle = "IDLE" if mailbox.can_idle() else "polling"
    except LoginRefused as exc:
        raise CredentialsRejected(str(exc)) from None
    except (MailboxError, aioimaplib.AioImapException, OSError, TimeoutError) as exc:
        raise CredentialsRejected(f"IMAP: {str(exc) or repr(exc)}") from None
    finally:
        await mailbox.close()
    smtp = await _smtp(settings)
    return f"IMAP {settings.imap_login()} {settings.mailbox} ({idle}), SMTP {smtp}"


async def _smtp(settings: EmailSettings) -> str:
    host, port = settings.smtp_host_or_default(), settings.smtp_port_or_default()
    smtp = aiosmtplib.SMTP(
        hostname=host,
        port=port,
        use_tls=settings.smtp_security == "tls",
        start_tls=True if settings.smtp_security == "starttls" else False,
        timeout=settings.timeout_seconds,
    )
    login = settings.smtp_login()
    try:
        await smtp.connect()
        await smtp.ehlo()
        if login is not None:
            await smtp.login(*login)
    except aiosmtplib.SMTPAuthenticationError as exc:
        raise CredentialsRejected(f"SMTP refused the login: {exc.code} {exc.message}") from None
    except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
        raise CredentialsRejected(f"SMTP {host}:{port} not answering: {type(exc).__name__}") from None
    finally:
        if smtp.is_connected:
            try:
                await smtp.quit()
            except aiosmtplib.SMTPException:
                smtp.close()
    return f"{host}:{port} ({'auth ' + login[0] if login else 'no auth'})"
