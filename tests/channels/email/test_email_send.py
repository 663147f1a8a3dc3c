"""Answers out: attachments, the reply headers without the asking mail, DKIM verified with
dkimpy against the test's public key; and `chatgate doctor`'s live probe."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import dkim
import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from app.errors import ChannelRejected
from app.events import FilePart, ImagePart, OutboundMessage, TextPart
from app.probe import CredentialsRejected
from channels.email import EmailChannel
from channels.email.probe import probe
from tests.app.test_doctor_live import _doctor
from tests.channels.email.support import email_env, email_settings
from tests.channels.support import send_only_context
from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(200)
PDF = b"%PDF-1.4 " + os.urandom(100)


def _key_pair() -> tuple[str, bytes]:
    """(private key PEM, the DNS TXT record publishing its public key)."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return pem, b"v=DKIM1; k=rsa; p=" + base64.b64encode(public)


def _answer(**metadata: object) -> OutboundMessage:
    return OutboundMessage(
        channel="email",
        chat_id="root@example.com",
        parts=(
            TextPart(text="Here you are.\n\nTwo files."),
            ImagePart(data_base64=base64.b64encode(PNG).decode(), mime_type="image/png"),
            FilePart(
                data_base64=base64.b64encode(PDF).decode(), name="notes.pdf", mime_type="application/pdf"
            ),
        ),
        metadata=dict(metadata),
    )


async def test_an_answer_carries_its_files_and_a_dkim_signature_that_verifies(
    imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    pem, record = _key_pair()
    settings = email_settings(imap_server, bot, smtp, dkim_private_key=pem, dkim_selector="s1")
    async with httpx.AsyncClient(timeout=30) as http:
        channel = EmailChannel(settings, send_only_context(http))
        result = await channel.send(
            _answer(
                reply_address="alice@example.com",
                reply_subject="Files",
                reply_message_id="q2@example.com",
                reply_references=["root@example.com", "q2@example.com"],
            )
        )
    [sent] = await smtp.wait_for(1)
    message = sent.message
    assert result.platform_message_id == str(message["Message-ID"]).strip("<>")
    assert message["References"] == "<root@example.com> <q2@example.com>"
    files = {p.get_filename(): p.get_content() for p in message.iter_attachments()}
    assert files == {"image-2.png": PNG, "notes.pdf": PDF}
    assert "Two files." in message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]

    asked: list[bytes] = []

    def dns(name: bytes, timeout: int = 5) -> bytes:
        asked.append(name)
        return record if name == f"s1._domainkey.{bot.rpartition('@')[2]}.".encode() else b""

    assert dkim.verify(sent.raw, dnsfunc=dns)
    assert asked and str(message["DKIM-Signature"]).replace(" ", "").find("d=example.org") >= 0
    # Changed in transit: the signature no longer holds.
    assert not dkim.verify(sent.raw.replace(b"Here you are.", b"Here you are!"), dnsfunc=dns)


async def test_an_answer_to_a_thread_nobody_knows_is_refused_not_guessed(
    imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    async with httpx.AsyncClient(timeout=30) as http:
        channel = EmailChannel(email_settings(imap_server, bot, smtp), send_only_context(http))
        with pytest.raises(ChannelRejected, match="no address known"):
            await channel.send(_answer())  # no records at all: refused, nothing sent
    assert smtp.received == []


@pytest.mark.slow
async def test_chatgate_doctor_checks_the_mailbox_live(
    tmp_path: Path, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    env = {**email_env(imap_server, bot, smtp), "CHANNELS": "email"}
    code, lines = await _doctor(tmp_path, **{**env, "EMAIL_SMTP_PASSWORD": "not-the-password"})
    assert code == 1
    assert (
        "FAIL  channel email: SMTP refused the login: 535 5.7.8 Authentication credentials invalid" in lines
    )
    assert not any("not-the-password" in line for line in lines)
    code, lines = await _doctor(tmp_path, **env)
    assert code == 0, lines
    learnt = f"IMAP {bot} INBOX (IDLE), SMTP 127.0.0.1:{smtp.port} (auth bot)"
    assert f"ok    channel email: credentials accepted ({learnt})" in lines


async def test_doctor_probe_logs_in_to_imap_and_smtp(imap_server: Dovecot, smtp: SmtpSink) -> None:
    bot, _ = imap_server.add_user()
    async with httpx.AsyncClient(timeout=30) as http:
        learnt = await probe(email_settings(imap_server, bot, smtp), http)
        assert bot in learnt and "IDLE" in learnt and f"auth {smtp.user}" in learnt
        assert smtp.logins == [smtp.user]
        with pytest.raises(CredentialsRejected, match="SMTP refused the login"):
            await probe(email_settings(imap_server, bot, smtp, smtp_password="wrong"), http)
        # Last: Dovecot delays the next login from an address that failed one (by seconds).
        with pytest.raises(CredentialsRejected, match="IMAP login refused"):
            await probe(email_settings(imap_server, bot, smtp, password="wrong"), http)
