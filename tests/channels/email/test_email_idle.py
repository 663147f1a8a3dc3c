"""IMAP IDLE against a real Dovecot: no new mail waits for the next IDLE round."""

from __future__ import annotations

import time

from channels.email.mailbox import Mailbox
from tests.channels.email.support import email_settings, mail
from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot
from tests.support.timing import scaled

IDLE = 20.0  # one IDLE round here: a mail seen only after it would be 20 s late


async def test_mail_reported_during_another_command_ends_the_wait_at_once(
    imap_server: Dovecot, smtp: SmtpSink
) -> None:
    """A server reports new mail (`* n EXISTS`) in the answer to whatever command runs when it
    arrives, and only once: a mail that came while the bot was fetching or flagging another
    one is not reported again in the IDLE that follows. The wait must not begin then."""
    bot, _ = imap_server.add_user()
    await imap_server.append(bot, mail(bot, "first").as_bytes())
    mailbox = Mailbox(email_settings(imap_server, bot, smtp))
    await mailbox.open()
    try:
        [(uid, _)] = await mailbox.new_mail(0)
        await imap_server.append(bot, mail(bot, "second").as_bytes())  # while the bot works on the first
        await mailbox.fetch(uid)
        await mailbox.mark_seen(uid)
        started = time.monotonic()
        await mailbox.wait(IDLE)
        waited = time.monotonic() - started
        assert waited < scaled(2), f"the second mail waited {waited:.1f} s for the next IDLE round"
        assert [u for u, _ in await mailbox.new_mail(uid)] == [uid + 1]
    finally:
        await mailbox.close()
