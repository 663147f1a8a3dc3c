"""An answer as a proper reply: threading headers, `Re:` subject, plain text with an HTML
alternative, attachments, `Auto-Submitted: auto-replied` (RFC 3834: other robots must not
answer it), and a DKIM signature when a key is configured (`dkimpy`)."""

from __future__ import annotations

import html
from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import formataddr, formatdate
from pathlib import Path

import dkim

# Signed header fields (RFC 6376 5.4.1's recommendations, plus what threads the answer).
SIGNED_HEADERS = (
    b"from",
    b"to",
    b"subject",
    b"date",
    b"message-id",
    b"in-reply-to",
    b"references",
    b"mime-version",
    b"content-type",
    b"auto-submitted",
)
_RE = ("re:", "re：", "回复:", "回复：", "答复:", "答复：", "aw:", "sv:")


@dataclass(frozen=True)
class Signer:
    selector: str
    domain: str
    key: bytes  # PEM

    @classmethod
    def load(cls, key: str, selector: str, domain: str) -> Signer:
        """`key` is the PEM text, or the path of a file holding it."""
        pem = key.encode() if "-----BEGIN" in key else Path(key).read_bytes()
        return cls(selector=selector, domain=domain, key=pem)

    def sign(self, raw: bytes) -> bytes:
        signature = dkim.sign(
            raw,
            self.selector.encode(),
            self.domain.encode(),
            self.key,
            include_headers=list(SIGNED_HEADERS),
        )
        return bytes(signature) + raw


def reply_subject(subject: str) -> str:
    subject = subject.strip()
    if subject.lower().startswith(_RE):
        return subject
    return f"Re: {subject}" if subject else "Re: your message"


def html_alternative(text: str) -> str:
    paragraphs = [p for p in text.replace("\r\n", "\n").split("\n\n") if p.strip()]
    body = "".join(f"<p>{html.escape(p).replace(chr(10), '<br>')}</p>" for p in paragraphs)
    return f'<!DOCTYPE html><html><head><meta charset="utf-8"></head><body>{body}</body></html>'


def compose(
    *,
    sender: str,
    sender_name: str,
    to: str,
    subject: str,
    text: str,
    message_id: str,
    in_reply_to: str | None,
    references: list[str],
    attachments: tuple[tuple[str, str, bytes], ...] = (),
) -> EmailMessage:
    message = EmailMessage()
    message["From"] = formataddr((sender_name, sender)) if sender_name else sender
    message["To"] = to
    message["Subject"] = reply_subject(subject)
    message["Date"] = formatdate(localtime=False, usegmt=True)
    message["Message-ID"] = f"<{message_id}>"
    if in_reply_to:
        message["In-Reply-To"] = f"<{in_reply_to}>"
    if references:
        message["References"] = " ".join(f"<{r}>" for r in references)
    message["Auto-Submitted"] = "auto-replied"
    # Exchange and Outlook: no out-of-office or other automatic answer to this one.
    message["X-Auto-Response-Suppress"] = "All"
    message.set_content(text or " ")
    message.add_alternative(html_alternative(text), subtype="html")
    for name, mime, data in attachments:
        maintype, _, subtype = mime.partition("/")
        if not subtype:
            maintype, subtype = "application", "octet-stream"
        message.add_attachment(data, maintype=maintype, subtype=subtype, filename=name)
    return message
