"""Email: one IMAP mailbox in (IDLE, or polling), SMTP answers out.

Inbound: one replica holds the mailbox (`email:<fingerprint>`, a connection lease) and
reads new mail by UID. Each mail is committed to the inbox (dedup on its Message-ID)
before its UID is saved in the lease row with the mailbox's UIDVALIDITY (fenced); a
holder that dies in between leaves the older UID, the next holder reads that mail again
and the inbox drops it. So a take-over loses nothing and answers nothing twice. Between
rounds the holder waits in IMAP IDLE (RFC 2177), or sleeps `EMAIL_POLL_SECONDS` where the
server has no IDLE. Like a socket, the watch is cancelled at once when the hold is lost or
handed over (SIGTERM): the inbox and the saved UID keep what was done.

Threads: a mail answering a known message (In-Reply-To, References) joins that message's
thread; otherwise the first References entry is the root; a mail without either starts
a thread keyed by its own Message-ID. One thread is one session (`email:<root id>`). A
reply from someone who never wrote in the thread starts a thread of its own: knowing a
Message-ID must not open another person's conversation (a session key is no credential).
The quoted part of a reply is taken off (`channels.email.quotes`) before it is stored.

Never answered: auto-replies, bounces, lists and reports (`channels.email.parse`), mail
from the bot's own address, and senders outside `EMAIL_ALLOWED_DOMAINS`. Answers carry
`Auto-Submitted: auto-replied`, so well-behaved robots do not answer them: no loops.

Outbound: a reply to the mail that asked (In-Reply-To, References, `Re:` subject), plain
text with an HTML alternative, attachments within `EMAIL_MEDIA_MAX_BYTES`, DKIM-signed
when a key is set; its Message-ID is derived from the outbound id, so an outbox retry
sends the same message again, never a second one.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from typing import Any

import aioimaplib
import aiosmtplib
import structlog

from app.channel import ChannelContext, SendResult
from app.connections import HeldConnection, fingerprint
from app.errors import ChannelRejected, ChannelSendAuthError, ChannelUnavailable
from app.events import FilePart, ImagePart, InboundEvent, OutboundMessage, Part, TextPart
from channels.common.media import Media, MediaTooLarge, inline_media, tell_too_large
from channels.email.compose import Signer, compose
from channels.email.mailbox import Mailbox, MailboxError
from channels.email.parse import Mail, read_mail, valid_address
from channels.email.settings import EmailSettings

log = structlog.get_logger(__name__)

THREAD = "thread"  # records: a thread's root → who wrote in it
MESSAGE = "message"  # records: a message id (theirs or ours) → its thread's root
TOLD = "too_large"  # records: mail told it was too large (by external id)
_IMAP_ERRORS = (MailboxError, aioimaplib.AioImapException, OSError, TimeoutError)
_ATTACHMENT = "attachment:"
_UNSENT = {
    "en": "(An attachment was left out: it is larger than {mb} MB.)",
    "zh": "（有附件未发送：超过 {mb} MB 的上限。）",
}


def record_key(message_id: str) -> str:
    """A message id as a record key and session-key component (long ones hashed)."""
    if len(message_id) <= 200:
        return message_id
    return "sha256-" + hashlib.sha256(message_id.encode()).hexdigest()


class EmailChannel:
    name = "email"

    def __init__(self, settings: EmailSettings, context: ChannelContext) -> None:
        self.settings = settings
        self.context = context
        self.address = (settings.address or "").strip().lower()
        where = f"{settings.imap_host}|{settings.imap_login()}|{settings.mailbox}"
        self.connection = f"email:{fingerprint(where)}"
        self.signer = (
            Signer.load(
                settings.dkim_private_key,
                settings.dkim_selector,
                settings.dkim_domain or self.address.rpartition("@")[2],
            )
            if settings.dkim_private_key and settings.dkim_selector
            else None
        )
        self.poll_error: str | None = None  # the last IMAP failure, for operators and tests
        self._holder: HeldConnection | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if not self.settings.imap_host or not self.address:
            log.warning(
                "email_not_configured", detail="EMAIL_ADDRESS and EMAIL_IMAP_HOST are needed to read mail"
            )
            return
        self._holder = HeldConnection(self.context.hold_connection, self.connection, self._watch)

    async def stop(self) -> None:
        if self._holder is not None:
            await self._holder.release()
            self._holder = None

    # --- inbound: the mailbox ---------------------------------------------------------

    async def _watch(self) -> None:
        """Hold the mailbox: read what is new, wait (IDLE), again; until the hold ends."""
        mailbox = Mailbox(self.settings)
        states = self.context.connection_state
        try:
            await mailbox.open()
            last = await self._position(mailbox)
            # No `confirm` before each round: IMAP is a socket, not a series of requests; a lost
            # hold or a hand-over cancels this at once, and whatever was committed is kept.
            while last is not None:
                for uid, size in await mailbox.new_mail(last):
                    await self._receive(mailbox, uid, size)
                    last = uid
                    state = {"uidvalidity": mailbox.uidvalidity, "last_uid": last}
                    if not await states.save_state(self.connection, state):
                        log.warning("email_position_not_saved", detail="the mailbox is no longer ours")
                        return
                self.poll_error = None
                await mailbox.wait(self.settings.idle_seconds)
        except _IMAP_ERRORS as exc:
            self.poll_error = f"IMAP: {str(exc) or repr(exc)}"
            log.warning("email_imap_failed", error=str(exc) or repr(exc))
            await asyncio.sleep(self.settings.retry_seconds)
        finally:
            await mailbox.close()

    async def _position(self, mailbox: Mailbox) -> int | None:
        """The last UID handled, from the lease row; None when the hold is gone."""
        state = await self.context.connection_state.load_state(self.connection) or {}
        if state.get("uidvalidity") == mailbox.uidvalidity:
            return int(state.get("last_uid") or 0)
        if state:
            log.warning(
                "email_mailbox_recreated",
                detail="UIDVALIDITY changed: the saved position is void",
                process_existing=self.settings.process_existing,
            )
        last = 0 if self.settings.process_existing else mailbox.uidnext - 1
        saved = {"uidvalidity": mailbox.uidvalidity, "last_uid": last}
        if not await self.context.connection_state.save_state(self.connection, saved):
            return None
        return last

    async def _receive(self, mailbox: Mailbox, uid: int, size: int) -> None:
        too_large = size > self.settings.max_message_bytes
        raw = await mailbox.fetch(uid, header_only=too_large)
        if raw is None:
            return  # expunged meanwhile
        try:
            mail = read_mail(raw, with_body=not too_large)
        except Exception as exc:  # a mail we cannot read: skipped, never looped on
            log.warning("email_unreadable", uid=uid, error=str(exc) or repr(exc))
            return
        reason = self._ignored(mail)
        if reason is not None:
            log.info("email_not_answered", uid=uid, message_id=mail.message_id, reason=reason)
        else:
            await self._store(mail, too_large)
        if self.settings.mark_seen:
            with contextlib.suppress(*_IMAP_ERRORS):
                await mailbox.mark_seen(uid)

    def _ignored(self, mail: Mail) -> str | None:
        if mail.automatic is not None:
            return mail.automatic
        if not mail.sender or not valid_address(mail.sender):
            return "no sender address"
        if mail.sender == self.address:
            return "sent by the bot's own address"
        if not self.settings.sender_served(mail.sender):
            return "sender's domain not in EMAIL_ALLOWED_DOMAINS"
        return None

    async def _store(self, mail: Mail, too_large: bool) -> None:
        root = await self._thread_of(mail)
        event = self._event(mail, root)
        if not event.parts and not too_large:
            log.info("email_empty", message_id=mail.message_id)  # nothing to answer
            return
        try:
            if too_large:
                raise MediaTooLarge(self.settings.max_message_bytes)
            if any(len(a.data) > self.settings.media_max_bytes for a in mail.attachments):
                raise MediaTooLarge(self.settings.media_max_bytes)
            event = await inline_media(
                event,
                lambda part: self._attachment(mail, part),
                transcribe=self.context.transcribe,
                channel=self.name,
                files=self.context.keeps_files,
            )
        except MediaTooLarge as exc:
            await self._tell_too_large(event, exc.limit)
            return
        await self.context.accept([event])

    async def _tell_too_large(self, event: InboundEvent, limit: int) -> None:
        """The polite answer to a mail too large to read: nothing is stored, so the access
        check has not run; only a sender who may talk here is told (or anyone could have the
        bot mail a forged From), and only once (a take-over reads the mail again)."""
        s = self.settings
        if (s.access or ("allowlist" if s.allowed_senders else "open")) != "open" and (
            event.sender_id not in s.allowed_senders
        ):
            return
        records = self.context.records
        if records is not None:
            if await records.get(TOLD, event.external_id or "") is not None:
                return
            await records.put(TOLD, event.external_id or "", {}, open=False)
        await tell_too_large(self.send, event, s.locale, limit)

    async def _attachment(self, mail: Mail, part: ImagePart | FilePart) -> Media | None:
        ref = part.url or ""
        if not ref.startswith(_ATTACHMENT):
            return None
        found = mail.attachments[int(ref[len(_ATTACHMENT) :])]
        return Media(found.data, found.mime_type)

    async def _thread_of(self, mail: Mail) -> str:
        """The root id of the mail's thread (see the module), recorded for later mail."""
        records = self.context.records
        root: str | None = None
        candidates = [r for r in (mail.in_reply_to, *reversed(mail.references)) if r]
        if records is not None:
            for ref in candidates:
                known = await records.get(MESSAGE, record_key(ref))
                if known is not None and known.data.get("root"):
                    root = str(known.data["root"])
                    break
        if root is None:
            root = mail.references[0] if mail.references else mail.in_reply_to or mail.message_id
        root = record_key(root)
        if records is None:
            return root
        own = record_key(mail.message_id)
        thread = await records.get(THREAD, root)
        people = list(thread.data.get("people") or []) if thread is not None else []
        if thread is not None and root != own and mail.sender not in people:
            # Someone else naming a thread's ids: a thread of their own, not that session.
            root, thread, people = own, await records.get(THREAD, own), []
        if mail.sender not in people:
            people.append(mail.sender)
            data = {
                "people": people,
                "subject": (thread.data.get("subject") if thread else None) or mail.subject,
            }
            await records.put(THREAD, root, data, open=False)
        await records.put(MESSAGE, own, {"root": root}, open=False)
        return root

    def _event(self, mail: Mail, root: str) -> InboundEvent:
        text = mail.text
        if root == record_key(mail.message_id) and mail.subject:
            text = f"Subject: {mail.subject}\n\n{text}".strip()
        parts: list[Part] = [TextPart(text=text)] if text else []
        for i, attachment in enumerate(mail.attachments):
            ref = f"{_ATTACHMENT}{i}"
            if attachment.mime_type.startswith("image/"):
                parts.append(ImagePart(url=ref, mime_type=attachment.mime_type))
            else:
                parts.append(
                    FilePart(
                        url=ref,
                        name=attachment.name,
                        mime_type=attachment.mime_type,
                        size=len(attachment.data),
                    )
                )
        chain = mail.thread_chain
        if root not in chain and "@" in root:  # a client that sent no References: the root leads
            chain.insert(0, root)
        metadata: dict[str, Any] = {
            "reply_address": mail.sender,
            "reply_subject": mail.subject,
            "reply_message_id": mail.message_id,
            "reply_references": chain,
        }
        if mail.sender_name:
            metadata["sender_name"] = mail.sender_name
        return InboundEvent(
            channel=self.name,
            chat_id=root,
            sender_id=mail.sender,
            parts=tuple(parts),
            external_id=f"mid:{record_key(mail.message_id)}",
            session_scope=self.settings.session_scope,
            metadata=metadata,
        )

    # --- outbound -------------------------------------------------------------------------

    async def _reply_headers(self, message: OutboundMessage) -> tuple[str, str, str | None, list[str]]:
        """(to, subject, in-reply-to, references) of an answer: from the mail it answers,
        else (an answer nobody's mail asked for: a scheduled job's) from the thread record."""
        meta = message.metadata
        to = meta.get("reply_address")
        if isinstance(to, str) and to:
            refs = meta.get("reply_references")
            chain = [str(r) for r in refs] if isinstance(refs, list) else []
            replied = meta.get("reply_message_id")
            return to, str(meta.get("reply_subject") or ""), str(replied) if replied else None, chain
        thread = await self.context.records.get(THREAD, message.chat_id) if self.context.records else None
        people = thread.data.get("people") if thread is not None else None
        if not people:
            raise ChannelRejected(f"no address known for the mail thread {message.chat_id!r}")
        assert thread is not None
        root = message.chat_id if "@" in message.chat_id else None  # a hashed id is no Message-ID
        return str(people[0]), str(thread.data.get("subject") or ""), root, [root] if root else []

    def _attachments(self, message: OutboundMessage) -> tuple[list[tuple[str, str, bytes]], list[str], int]:
        """(name, type, bytes) to attach, links to name in the text, and how many were too large."""
        files: list[tuple[str, str, bytes]] = []
        links: list[str] = []
        dropped = 0
        for i, part in enumerate(message.parts):
            if not isinstance(part, ImagePart | FilePart):
                continue
            if part.data_base64:
                data = base64.b64decode(part.data_base64)
                if len(data) > self.settings.media_max_bytes:
                    dropped += 1
                    continue
                mime = part.mime_type or (
                    "image/png" if isinstance(part, ImagePart) else "application/octet-stream"
                )
                default = f"image-{i + 1}.{mime.partition('/')[2] or 'bin'}"
                name = (part.name if isinstance(part, FilePart) else None) or default
                files.append((name, mime, data))
            elif part.url:
                links.append(part.url)
        return files, links, dropped

    async def send(self, message: OutboundMessage) -> SendResult:
        if not self.address:
            raise ChannelSendAuthError("EMAIL_ADDRESS is not set: no answer can be sent")
        to, subject, in_reply_to, references = await self._reply_headers(message)
        files, links, dropped = self._attachments(message)
        text = message.text
        if links:
            text = "\n\n".join(t for t in (text, "\n".join(links)) if t)
        if dropped:
            mb = f"{self.settings.media_max_bytes / 1_000_000:g}"
            text = "\n\n".join(t for t in (text, _UNSENT[self.settings.locale].format(mb=mb)) if t)
        if not text.strip() and not files:
            return SendResult()
        message_id = f"chatgate.{message.message_id}@{self.address.rpartition('@')[2]}"
        if self.context.records is not None:  # before sending: a quick reply to it finds its thread
            await self.context.records.put(
                MESSAGE, record_key(message_id), {"root": message.chat_id}, open=False
            )
        mail = compose(
            sender=self.address,
            sender_name=self.settings.from_name,
            to=to,
            subject=subject,
            text=text,
            message_id=message_id,
            in_reply_to=in_reply_to,
            references=references,
            attachments=tuple(files),
        )
        raw = mail.as_bytes()
        if self.signer is not None:
            raw = self.signer.sign(raw)
        await self._submit(raw, to)
        return SendResult(platform_message_id=message_id)

    async def _submit(self, raw: bytes, to: str) -> None:
        s = self.settings
        login = s.smtp_login()
        try:
            await aiosmtplib.send(
                raw,
                sender=self.address,
                recipients=[to],
                hostname=s.smtp_host_or_default(),
                port=s.smtp_port_or_default(),
                username=login[0] if login else None,
                password=login[1] if login else None,
                use_tls=s.smtp_security == "tls",
                start_tls=True if s.smtp_security == "starttls" else False,
                timeout=s.timeout_seconds,
            )
        except aiosmtplib.SMTPAuthenticationError as exc:
            raise ChannelSendAuthError(f"SMTP refused the login: {exc.code} {exc.message}") from exc
        except aiosmtplib.SMTPRecipientsRefused as exc:
            raise ChannelRejected(f"SMTP refused the recipient: {exc.recipients}") from exc
        except aiosmtplib.SMTPResponseException as exc:
            if 500 <= exc.code < 600:
                raise ChannelRejected(f"SMTP refused the answer: {exc.code} {exc.message}") from exc
            raise ChannelUnavailable(f"SMTP answered {exc.code} {exc.message}") from exc
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as exc:
            raise ChannelUnavailable(f"SMTP server not reachable: {exc!r}") from exc


__all__ = ["EmailChannel", "record_key"]
