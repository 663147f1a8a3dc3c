"""One IMAP session on the bot's mailbox (`aioimaplib`): new mail by UID, IDLE to wait.

Mail is addressed by UID within the mailbox's UIDVALIDITY (RFC 3501 2.3.1.1): a UID is
never reused while UIDVALIDITY stays, so "the last UID handled" is a position that
survives restarts and take-overs. A new UIDVALIDITY means the mailbox was recreated and
the old position means nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl

import aioimaplib

from channels.email.settings import EmailSettings

_FETCH_UID = re.compile(rb"\bUID (\d+)")
_FETCH_SIZE = re.compile(rb"\bRFC822\.SIZE (\d+)")
_UIDVALIDITY = re.compile(rb"\[UIDVALIDITY (\d+)\]")
_UIDNEXT = re.compile(rb"\[UIDNEXT (\d+)\]")
_EXISTS = re.compile(rb"^\* \d+ EXISTS\b")


class MailboxError(Exception):
    """The IMAP server refused a command (the text is its answer) or went away."""


class LoginRefused(MailboxError):
    """The server refused the login."""


def _check(response: aioimaplib.Response, what: str) -> aioimaplib.Response:
    if response.result != "OK":
        detail = b" ".join(bytes(line) for line in response.lines[-1:]).decode("utf-8", "replace")
        raise MailboxError(f"IMAP {what}: {response.result} {detail}".strip())
    return response


class Mailbox:
    def __init__(self, settings: EmailSettings) -> None:
        self.settings = settings
        self.client: aioimaplib.IMAP4 | None = None
        self.uidvalidity = 0
        self.uidnext = 1
        # The server said `* n EXISTS` (new mail) since the last look at it (`new_mail`).
        self.reported_new = False

    async def login(self) -> aioimaplib.IMAP4:
        s = self.settings
        host, port, timeout = s.imap_host or "", s.imap_port_or_default(), s.timeout_seconds
        if s.imap_security == "tls":
            client: aioimaplib.IMAP4 = aioimaplib.IMAP4_SSL(
                host, port, timeout=timeout, ssl_context=ssl.create_default_context()
            )
        else:
            client = aioimaplib.IMAP4(host, port, timeout=timeout)
        self.client = client
        self._note_new_mail(client)
        try:
            await client.wait_hello_from_server()
        except (OSError, TimeoutError) as exc:
            raise MailboxError(f"IMAP server {host}:{port} not answering: {exc!r}") from exc
        response = await client.login(s.imap_login(), s.password or "")
        if response.result != "OK":
            raise LoginRefused(
                f"IMAP login refused: {b' '.join(bytes(x) for x in response.lines).decode(errors='replace')}"
            )
        return client

    async def open(self) -> None:
        """Log in and select the mailbox (UIDVALIDITY and UIDNEXT from its answer)."""
        client = await self.login()
        response = _check(await client.select(self.settings.mailbox), f"SELECT {self.settings.mailbox}")
        for line in response.lines:
            raw = bytes(line)
            if m := _UIDVALIDITY.search(raw):
                self.uidvalidity = int(m.group(1))
            if m := _UIDNEXT.search(raw):
                self.uidnext = int(m.group(1))
        if not self.uidvalidity:
            raise MailboxError("IMAP SELECT gave no UIDVALIDITY")

    def _note_new_mail(self, client: aioimaplib.IMAP4) -> None:
        """Remember every `* n EXISTS` the server sends, whatever command it answers.

        A server reports new mail once, in the answer to the command running when it came:
        a mail that arrives while the bot fetches or flags another one is told in that
        FETCH's or STORE's answer, and the IDLE that follows does not tell it again.
        aioimaplib drops an untagged EXISTS that comes during a FETCH or a STORE ("ignored
        untagged response"), so that mail waited for the next IDLE round (up to
        EMAIL_IDLE_SECONDS, ten minutes by default). The protocol's `data_received` (the
        transport calls it for each chunk) is wrapped to see the lines first. A mail whose
        text holds such a line only costs one more look.
        """
        protocol = client.protocol
        receive = protocol.data_received
        partial = b""

        def noting(data: bytes) -> None:
            nonlocal partial
            lines = (partial + data).split(b"\r\n")
            partial = lines.pop()[-64:]  # an EXISTS line is short: its start is kept
            if any(_EXISTS.match(line) for line in lines):
                self.reported_new = True
            receive(data)

        protocol.data_received = noting  # type: ignore[method-assign]

    def _client(self) -> aioimaplib.IMAP4:
        if self.client is None:
            raise MailboxError("not connected")
        return self.client

    async def new_mail(self, after: int) -> list[tuple[int, int]]:
        """(UID, size) of the mail with a UID above `after`, in UID order."""
        self.reported_new = False  # what this FETCH finds; anything told from now on is newer
        response = _check(
            await self._client().uid("fetch", f"{after + 1}:*", "(UID RFC822.SIZE)"), "UID FETCH"
        )
        found = {}
        for line in response.lines:
            raw = bytes(line)
            uid, size = _FETCH_UID.search(raw), _FETCH_SIZE.search(raw)
            # `n:*` always names the last mail, even one below n: only UIDs above count.
            if uid and size and int(uid.group(1)) > after:
                found[int(uid.group(1))] = int(size.group(1))
        return sorted(found.items())

    async def fetch(self, uid: int, *, header_only: bool = False) -> bytes | None:
        """The mail's bytes (or its header only), without setting \\Seen; None if it is gone."""
        section = "BODY.PEEK[HEADER]" if header_only else "BODY.PEEK[]"
        response = _check(await self._client().uid("fetch", str(uid), f"(UID {section})"), "UID FETCH")
        lines = response.lines
        for i, line in enumerate(lines):
            if isinstance(line, bytearray) and i > 0:
                m = _FETCH_UID.search(bytes(lines[i - 1]))
                if m is None or int(m.group(1)) == uid:
                    return bytes(line)
        return None

    async def mark_seen(self, uid: int) -> None:
        _check(await self._client().uid("store", str(uid), "+FLAGS.SILENT", "(\\Seen)"), "UID STORE")

    def can_idle(self) -> bool:
        return self.settings.idle and self.client is not None and self.client.has_capability("IDLE")

    async def wait(self, seconds: float) -> None:
        """Until the server says something changed (IDLE) or `seconds` passed; at once when
        it told of new mail since the last `new_mail`."""
        if self.reported_new:
            return
        if not self.can_idle():
            await asyncio.sleep(min(seconds, self.settings.poll_seconds))
            return
        client = self._client()
        idle = await client.idle_start(timeout=seconds)
        try:
            await client.wait_server_push(timeout=seconds + self.settings.timeout_seconds)
        finally:
            if client.has_pending_idle():
                client.idle_done()
            with contextlib.suppress(TimeoutError, asyncio.CancelledError, aioimaplib.AioImapException):
                await asyncio.wait_for(idle, self.settings.timeout_seconds)

    async def close(self) -> None:
        if self.client is None:
            return
        client, self.client = self.client, None
        try:
            if not client.has_pending_idle():
                await asyncio.wait_for(client.logout(), 5)
        except Exception:  # going away either way: the socket is closed below
            pass
        finally:
            transport = getattr(client.protocol, "transport", None)
            if transport is not None:
                transport.close()
