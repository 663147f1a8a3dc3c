"""Reading mail: machines told from people, the quoted part of replies, thread ids."""

from __future__ import annotations

import pytest

from channels.email.parse import MAX_REFERENCES, read_mail
from channels.email.quotes import html_text, strip_plain
from tests.channels.email.support import mail


def _raw(**kw: object) -> bytes:
    return mail("bot@example.org", str(kw.pop("text", "hi")), **kw).as_bytes()  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("headers", "sender", "why"),
    [
        ({"Auto-Submitted": "auto-replied"}, "a@example.com", "Auto-Submitted: auto-replied"),
        (
            {"Auto-Submitted": "auto-generated; type=vacation"},
            "a@example.com",
            "Auto-Submitted: auto-generated",
        ),
        ({"Precedence": "junk"}, "a@example.com", "Precedence: junk"),
        ({"Precedence": "list"}, "a@example.com", "Precedence: list"),
        ({"X-Autoreply": "yes"}, "a@example.com", "X-Autoreply"),
        ({"X-Auto-Response-Suppress": "All"}, "a@example.com", "X-Auto-Response-Suppress"),
        ({"List-Id": "<x.example.com>"}, "a@example.com", "List-Id"),
        ({"Return-Path": "<>"}, "a@example.com", "null return path"),
        ({}, "Postmaster@example.com", "sender postmaster"),
        ({}, "mailer-daemon@example.com", "sender mailer-daemon"),
    ],
)
def test_machines_are_recognised(headers: dict[str, str], sender: str, why: str) -> None:
    assert read_mail(_raw(headers=headers, sender=sender)).automatic == why


def test_people_are_not_machines() -> None:
    assert read_mail(_raw(headers={"Auto-Submitted": "no", "Precedence": "normal"})).automatic is None


@pytest.mark.parametrize(
    "quoted",
    [
        "On Mon, 1 Jan 2024 at 10:00, Bot <bot@example.org> wrote:\n> old text\n> more",
        "On Mon, 1 Jan 2024 at 10:00, A Very Long Name <bot@example.org>\nwrote:\n\n> old text",
        "在 2024年1月1日 10:00, Bot <bot@example.org> 写道：\n> 旧的内容",
        "-----Original Message-----\nFrom: Bot\nold text",
        "From: Bot <bot@example.org>\nSent: Monday, 1 January 2024 10:00\nTo: Alice\nold text",
        "发件人: Bot\n发送时间: 2024年1月1日\nold text",
    ],
)
def test_the_quoted_part_of_a_plain_reply_is_left_out(quoted: str) -> None:
    assert strip_plain(f"New words here.\nSecond line.\n\n{quoted}\n") == "New words here.\nSecond line."


def test_inline_quote_lines_are_left_out_and_the_rest_kept() -> None:
    assert (
        strip_plain("> a question\nmy answer\n> another\nmy second answer") == "my answer\nmy second answer"
    )


@pytest.mark.parametrize(
    "quoted",
    [
        '<blockquote type="cite"><div>old <b>text</b></div></blockquote>',
        '<div class="gmail_quote"><div class="gmail_attr">On Mon wrote:</div>'
        "<blockquote>old</blockquote></div>",
        '<div class="moz-cite-prefix">On Mon, Bot wrote:<br></div><blockquote>old</blockquote>',
        '<div id="divRplyFwdMsg"><b>From:</b> Bot</div><div>old text</div>',
        "<div>On Mon, 1 Jan 2024, Bot &lt;bot@example.org&gt; wrote:</div><blockquote>old</blockquote>",
    ],
)
def test_the_quoted_part_of_an_html_reply_is_left_out(quoted: str) -> None:
    head = "<html><head><style>p {}</style></head>"
    html = f"{head}<body><div>New <i>words</i>&nbsp;here.</div>{quoted}</body></html>"
    assert html_text(html) == "New words here."


def test_an_html_only_mail_is_read_as_text() -> None:
    message = mail("bot@example.org", "")
    message.set_content("<p>Hello</p><p>there</p>", subtype="html")
    assert read_mail(message.as_bytes()).text == "Hello\n\nthere"


def test_thread_ids_and_the_answer_chain() -> None:
    refs = [f"r{i}@example.com" for i in range(30)]
    got = read_mail(_raw(message_id="me@example.com", in_reply_to="r29@example.com", references=refs))
    assert (got.message_id, got.in_reply_to, got.references[0]) == (
        "me@example.com",
        "r29@example.com",
        "r0@example.com",
    )
    chain = got.thread_chain
    assert len(chain) == MAX_REFERENCES and chain[0] == "r0@example.com" and chain[-1] == "me@example.com"


def test_a_mail_without_message_id_gets_a_stable_one() -> None:
    raw = b"From: a@example.com\r\nTo: bot@example.org\r\nSubject: x\r\n\r\nhello\r\n"
    first, again = read_mail(raw), read_mail(raw)
    assert first.message_id == again.message_id and first.message_id.endswith("@chatgate.invalid")
    assert first.sender == "a@example.com" and first.text == "hello"


def test_a_mail_that_is_all_quote_keeps_it() -> None:
    quoted = "On Mon, 1 Jan 2024, Bob <bob@example.com> wrote:\n> the forwarded words"
    assert read_mail(_raw(text=quoted)).text == quoted
    message = mail("bot@example.org", "")
    message.set_content("<blockquote>the forwarded words</blockquote>", subtype="html")
    assert read_mail(message.as_bytes()).text == "the forwarded words"
