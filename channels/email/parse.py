"""A received mail read for the gateway: who, which thread, the new text, the files, and
whether it is a machine's mail that must never be answered.

Never answered (no mail loops, RFC 3834): `Auto-Submitted` other than `no`, `Precedence:
bulk|junk|list`, `X-Autoreply`/`X-Autorespond`, `X-Auto-Response-Suppress`, `List-Id`,
a null return path (`Return-Path: <>`), senders `mailer-daemon`/`postmaster`, and
`multipart/report` (delivery status notifications, read receipts).
"""

from __future__ import annotations

import email
import email.policy
import hashlib
import re
from dataclasses import dataclass
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import parseaddr

from channels.email.quotes import html_text, strip_plain

_MSGID = re.compile(r"<([^<>\s]+)>")
_BOUNCE_SENDERS = {"mailer-daemon", "postmaster", "mail-daemon", "mailerdaemon"}
MAX_REFERENCES = 20  # kept in an answer's References: the first (root) and the newest


@dataclass(frozen=True)
class Attachment:
    name: str
    mime_type: str
    data: bytes


@dataclass(frozen=True)
class Mail:
    message_id: str  # without the angle brackets; made up from the bytes when missing
    sender: str  # the From address, lower-case
    sender_name: str
    subject: str
    in_reply_to: str | None
    references: tuple[str, ...]
    text: str  # the new text only (the quoted part stripped)
    attachments: tuple[Attachment, ...]
    automatic: str | None  # why it must not be answered, if it must not

    @property
    def thread_chain(self) -> list[str]:
        """The References of an answer to this mail (RFC 5322 3.6.4): its own plus this id."""
        chain = list(self.references) or ([self.in_reply_to] if self.in_reply_to else [])
        chain.append(self.message_id)
        if len(chain) > MAX_REFERENCES:
            chain = [chain[0], *chain[-(MAX_REFERENCES - 1) :]]
        return chain


def message_ids(value: str | None) -> list[str]:
    """The ids in a Message-ID, In-Reply-To or References header, without brackets."""
    return _MSGID.findall(str(value or ""))


def parse_message(raw: bytes) -> EmailMessage:
    message = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def automatic(message: EmailMessage) -> str | None:
    """Why the mail was sent by a machine (never to be answered), or None for a person's."""
    auto = str(message.get("Auto-Submitted", "") or "").split(";")[0].strip().lower()
    if auto and auto != "no":
        return f"Auto-Submitted: {auto}"
    precedence = str(message.get("Precedence", "") or "").strip().lower()
    if precedence in ("bulk", "junk", "list"):
        return f"Precedence: {precedence}"
    for header in ("X-Autoreply", "X-Autorespond", "X-Auto-Response-Suppress", "List-Id"):
        if message.get(header) is not None:
            return header
    return_path = message.get("Return-Path")
    if return_path is not None and str(return_path).strip() in ("<>", ""):
        return "null return path"
    local = parseaddr(str(message.get("From", "") or ""))[1].lower().partition("@")[0]
    if local in _BOUNCE_SENDERS:
        return f"sender {local}"
    if message.get_content_type() == "multipart/report":
        return f"report ({message.get_param('report-type') or 'unknown'})"
    return None


def _text(message: EmailMessage) -> str:
    body = message.get_body(preferencelist=("plain", "html"))
    if body is None:
        return ""
    try:
        content = body.get_content()
    except (LookupError, ValueError):  # an unknown charset: the bytes as well as they go
        payload = body.get_payload(decode=True)
        content = payload.decode("utf-8", "replace") if isinstance(payload, bytes) else ""
    if not isinstance(content, str):
        return ""
    new = html_text(content) if body.get_content_type() == "text/html" else strip_plain(content)
    # Nothing of its own (a bare forward, a quote sent back): the quoted text is all there is.
    return new or (
        html_text(content, keep_quotes=True) if body.get_content_type() == "text/html" else content.strip()
    )


def _attachments(message: EmailMessage) -> tuple[Attachment, ...]:
    found: list[Attachment] = []
    for part in message.iter_attachments():
        if not isinstance(part, EmailMessage):
            continue
        if part.get_content_maintype() == "message":
            data = part.as_bytes()
        else:
            payload = part.get_payload(decode=True)
            data = payload if isinstance(payload, bytes) else b""
        name = part.get_filename() or f"attachment-{len(found) + 1}"
        found.append(Attachment(name=name, mime_type=part.get_content_type(), data=data))
    return tuple(found)


def read_mail(raw: bytes, *, with_body: bool = True) -> Mail:
    """The mail in `raw` (`with_body=False`: its header only, e.g. of a mail too large to read)."""
    message = parse_message(raw)
    ids = message_ids(message.get("Message-ID"))
    message_id = ids[0] if ids else f"sha256-{hashlib.sha256(raw).hexdigest()[:40]}@chatgate.invalid"
    name, address = parseaddr(str(message.get("From", "") or ""))
    in_reply_to = message_ids(message.get("In-Reply-To"))
    return Mail(
        message_id=message_id,
        sender=address.strip().lower(),
        sender_name=name,
        subject=" ".join(str(message.get("Subject", "") or "").split()),
        in_reply_to=in_reply_to[-1] if in_reply_to else None,
        references=tuple(message_ids(message.get("References"))),
        text=_text(message) if with_body else "",
        attachments=_attachments(message) if with_body else (),
        automatic=automatic(message),
    )


def valid_address(address: str) -> bool:
    try:
        Address(addr_spec=address)
    except (ValueError, IndexError):
        return False
    return "@" in address
