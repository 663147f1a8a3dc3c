"""Email against a real Dovecot (IMAP) and a real SMTP server (aiosmtpd), on both stores."""

from __future__ import annotations

import base64
import os
from email.message import EmailMessage

from sqlalchemy import select

from app.db.models import inbox
from app.events import OutboundMessage, TextPart
from tests.channels.email.support import email_settings, mail, message_id_of, saved_position
from tests.channels.support import count, inbox_keys, wait_outbox_final
from tests.conftest import ServeApp
from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot
from tests.support.providers import RecordingProvider
from tests.support.timing import eventually

PNG = b"\x89PNG\r\n\x1a\n" + os.urandom(300)


async def test_a_mail_gets_a_threaded_reply(serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink) -> None:
    bot, _ = imap_server.add_user()
    question = mail(bot, "Hello there", subject="Greetings", message_id="m1@example.com")
    await imap_server.append(bot, question.as_bytes())
    await imap_server.append(bot, question.as_bytes())  # delivered twice (a second copy): one answer
    later = mail(bot, "Another topic", subject="Other", message_id="m2@example.com")
    await imap_server.append(bot, later.as_bytes())
    async with serve(channel_settings={"email": email_settings(imap_server, bot, smtp)}) as srv:
        sent, _ = await smtp.wait_for(2)
        await wait_outbox_final(srv.runtime, 2)
        assert await inbox_keys(srv.runtime) == ["email:m1@example.com", "email:m2@example.com"]
        assert len(smtp.received) == 2
        # An answer no mail asked for (a scheduled job's) goes to the thread from its record.
        reminder = OutboundMessage(
            channel="email", chat_id="m1@example.com", parts=(TextPart(text="Reminder"),)
        )
        await srv.runtime.adapters["email"].send(reminder)
        [*_, nudge] = await smtp.wait_for(3)
    assert (nudge.rcpt_tos, nudge.message["Subject"]) == (("alice@example.com",), "Re: Greetings")
    assert nudge.message["In-Reply-To"] == nudge.message["References"] == "<m1@example.com>"
    answer = sent.message
    assert sent.rcpt_tos == ("alice@example.com",) and sent.mail_from == bot
    assert answer["To"] == "alice@example.com" and answer["From"] == bot
    assert answer["Subject"] == "Re: Greetings"
    assert answer["In-Reply-To"] == "<m1@example.com>"
    assert answer["References"] == "<m1@example.com>"
    assert answer["Auto-Submitted"] == "auto-replied"
    assert sent.login == smtp.user
    plain = answer.get_body(preferencelist=("plain",))
    html = answer.get_body(preferencelist=("html",))
    assert plain is not None and html is not None
    assert "You said: Subject: Greetings" in plain.get_content() and "Hello there" in plain.get_content()
    assert "Hello there" in html.get_content()


async def test_a_reply_in_the_thread_lands_on_its_session_without_the_quote(
    serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    provider = RecordingProvider()
    first = mail(bot, "Tell me about otters.", subject="Otters", message_id="root@example.com")
    await imap_server.append(bot, first.as_bytes())
    async with serve(
        channel_settings={"email": email_settings(imap_server, bot, smtp)}, provider=provider
    ) as srv:
        [answer] = await smtp.wait_for(1)
        ours = message_id_of(answer.message)
        # Alice answers the bot's answer: only In-Reply-To names it (a client that keeps no References).
        plain_reply = mail(
            bot,
            "Thanks, and beavers?\n\nOn Sun, 6 Dec 2026 at 10:00, chatgate <bot@example.org>\nwrote:\n"
            "> echo Subject: Otters\n> Tell me about otters.\n",
            subject="Re: Otters",
            in_reply_to=ours,
        )
        await imap_server.append(bot, plain_reply.as_bytes())
        await smtp.wait_for(2)
        # An HTML-only reply (Gmail's quote container) and a Chinese client's plain quote.
        html_reply = mail(
            bot,
            "",
            subject="Re: Otters",
            in_reply_to=ours,
            references=["root@example.com", ours],
            html='<div dir="ltr">And <b>badgers</b>?</div><br><div class="gmail_quote">'
            '<div class="gmail_attr">On Sun, Dec 6, 2026 chatgate wrote:</div>'
            "<blockquote>echo Tell me about otters.</blockquote></div>",
        )
        html_reply.get_body(preferencelist=("plain",)).set_content("")  # type: ignore[union-attr]
        await imap_server.append(bot, _html_only(html_reply))
        await smtp.wait_for(3)
        chinese = mail(
            bot,
            "那么水獭吃什么？\n\n在 2026年12月6日 10:00, chatgate <bot@example.org> 写道：\n> echo 水獭\n",
            subject="回复: Otters",
            references=["root@example.com"],
        )
        await imap_server.append(bot, chinese.as_bytes())
        # Someone else naming the thread's ids does not join Alice's conversation.
        stranger = mail(bot, "Let me in", sender="mallory@example.net", references=["root@example.com", ours])
        await imap_server.append(bot, stranger.as_bytes())
        sent = await smtp.wait_for(5)
        await wait_outbox_final(srv.runtime, 5)
        keys = await inbox_keys(srv.runtime)
    assert keys[:4] == ["email:root@example.com"] * 4
    assert keys[4] == f"email:{message_id_of(stranger)}"
    seen = [c.user_text for c in provider.calls]
    assert seen[1] == "Thanks, and beavers?"
    assert seen[2] == "And badgers?"
    assert seen[3] == "那么水獭吃什么？"
    # The thread's session holds the whole conversation: the model saw the earlier turns.
    history = [m.content for m in provider.calls[3].messages if m.role == "user"]
    assert history[-4:] == ["Subject: Otters\n\nTell me about otters.", *seen[1:4]]
    # Every answer replies to the mail that asked, within the thread. The Chinese mail's
    # answer and the stranger's run at once (two sessions) and leave in either order.
    by_asked = {str(out.message["In-Reply-To"]): out for out in sent}
    for asked in (plain_reply, html_reply, chinese):
        out = by_asked[f"<{message_id_of(asked)}>"]
        assert str(out.message["References"]).split()[0] == "<root@example.com>"
    assert [str(out.message["In-Reply-To"]) for out in sent[1:3]] == [
        f"<{message_id_of(plain_reply)}>",
        f"<{message_id_of(html_reply)}>",
    ]
    assert sent[1].message["Subject"] == "Re: Otters"
    assert by_asked[f"<{message_id_of(chinese)}>"].message["Subject"] == "回复: Otters"


def _html_only(message: EmailMessage) -> bytes:
    html = message.get_body(preferencelist=("html",))
    assert html is not None
    only = EmailMessage()
    for name in ("From", "To", "Subject", "Date", "Message-ID", "In-Reply-To", "References"):
        if message[name] is not None:
            only[name] = message[name]
    only.set_content(html.get_content(), subtype="html")
    return only.as_bytes()


async def test_auto_replies_bounces_lists_and_empty_mail_are_never_answered(
    serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    machines = [
        mail(bot, "I am out of the office", headers={"Auto-Submitted": "auto-replied"}),
        mail(bot, "Away", headers={"X-Autoreply": "yes"}),
        mail(bot, "Newsletter", headers={"Precedence": "bulk"}),
        mail(bot, "List post", headers={"List-Id": "<talk.lists.example.com>"}),
        mail(bot, "Undeliverable", sender="MAILER-DAEMON@example.com"),
        mail(bot, "From the bot itself", sender=bot),
        mail(bot, "Outside the served domains", sender="eve@elsewhere.net"),
        mail(bot, "", references=["elsewhere@example.com"]),  # nothing in it to answer
    ]
    for message in machines:
        await imap_server.append(bot, message.as_bytes())
    await imap_server.append(bot, _bounce(bot))
    person = mail(bot, "A person writes", headers={"Auto-Submitted": "no"})
    await imap_server.append(bot, person.as_bytes())  # the last: answered after the others were read
    settings = email_settings(imap_server, bot, smtp, allowed_domains="example.com")
    async with serve(channel_settings={"email": settings}) as srv:
        [sent] = await smtp.wait_for(1)
        await wait_outbox_final(srv.runtime, 1)
        assert await count(srv.runtime, inbox) == 1
        flags = await imap_server.flags(bot)
        assert len(flags) == 10 and all("\\Seen" in f for f in flags), flags  # read, and marked so
    assert sent.message["In-Reply-To"] == f"<{message_id_of(person)}>"
    assert len(smtp.received) == 1


def _bounce(bot: str) -> bytes:
    """A delivery status notification (RFC 3464) as a mail server sends it."""
    return (
        "From: Mail Delivery System <bounces@mx.example.com>\r\n"
        f"To: {bot}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "Message-ID: <bounce-1@mx.example.com>\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b1"\r\n'
        "\r\n--b1\r\nContent-Type: text/plain\r\n\r\nYour message could not be delivered.\r\n"
        "--b1\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; mx.example.com\r\n\r\nFinal-Recipient: rfc822; gone@example.com\r\n"
        "Action: failed\r\nStatus: 5.1.1\r\n--b1--\r\n"
    ).encode()


async def test_attachments_in_and_a_file_over_the_limit(
    serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    with_image = mail(bot, "See the picture", attachments=[("otter.png", "image/png", PNG)])
    too_big = mail(
        bot, "And this one", attachments=[("big.bin", "application/octet-stream", os.urandom(5000))]
    )
    await imap_server.append(bot, with_image.as_bytes())
    await imap_server.append(bot, too_big.as_bytes())
    settings = email_settings(imap_server, bot, smtp, media_max_bytes=4000)
    async with serve(channel_settings={"email": settings}) as srv:
        sent = await smtp.wait_for(2)
        await wait_outbox_final(srv.runtime, 1)
        assert await count(srv.runtime, inbox) == 1
        async with srv.runtime.engine.connect() as conn:
            [payload] = [r[0] for r in await conn.execute(select(inbox.c.payload))]
    [image] = [p for p in payload["parts"] if p["type"] == "image"]
    assert base64.b64decode(image["data_base64"]) == PNG and image["mime_type"] == "image/png"
    told = next(s for s in sent if s.message["In-Reply-To"] == f"<{message_id_of(too_big)}>")
    assert "too large" in told.message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
    assert told.message["Subject"] == "Re: A question"


async def test_without_idle_new_mail_is_polled_and_old_mail_left_alone(
    serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    old = mail(bot, "Written before the bot existed")
    await imap_server.append(bot, old.as_bytes())
    settings = email_settings(imap_server, bot, smtp, idle=False, poll_seconds=0.2, process_existing=False)
    async with serve(channel_settings={"email": settings}) as srv:

        async def position_saved() -> bool:
            return await saved_position(srv.runtime.engine) is not None

        await eventually(position_saved)  # the first look at the mailbox: "from here on"
        new = mail(bot, "Written now")
        await imap_server.append(bot, new.as_bytes())
        [sent] = await smtp.wait_for(1)
        await wait_outbox_final(srv.runtime, 1)
        assert await count(srv.runtime, inbox) == 1
    assert sent.message["In-Reply-To"] == f"<{message_id_of(new)}>"


async def test_a_mail_over_the_size_limit_is_not_downloaded_and_the_sender_told(
    serve: ServeApp, imap_server: Dovecot, smtp: SmtpSink
) -> None:
    bot, _ = imap_server.add_user()
    # From someone not allowed to talk here: not told (a forged From would make the bot spam).
    stranger = mail(bot, "y" * 30_000, sender="mallory@example.net")
    await imap_server.append(bot, stranger.as_bytes())
    huge = mail(bot, "x" * 30_000, subject="Huge")
    await imap_server.append(bot, huge.as_bytes())
    settings = email_settings(
        imap_server, bot, smtp, max_message_bytes=20_000, allowed_senders="alice@example.com"
    )
    async with serve(channel_settings={"email": settings}) as srv:
        [sent] = await smtp.wait_for(1)
        assert await count(srv.runtime, inbox) == 0
    assert len(smtp.received) == 1
    assert sent.message["In-Reply-To"] == f"<{message_id_of(huge)}>" and sent.message["Subject"] == "Re: Huge"
    assert "too large" in sent.message.get_body(preferencelist=("plain",)).get_content()  # type: ignore[union-attr]
