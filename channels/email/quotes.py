"""The quoted part of a reply, taken off before the model sees the mail.

A reply repeats the mail it answers: below an attribution line ("On Mon, 1 Jan 2024, Alice
<a@example.org> wrote:", Chinese clients' "在 2024年1月1日, Alice 写道:" (with full-width marks), Outlook's
"-----Original Message-----" or its "From: … Sent: …" block) as `>` lines in plain text,
and in HTML inside a `<blockquote>`, Gmail's `gmail_quote` container, Thunderbird's
`moz-cite-prefix` or Outlook's `divRplyFwdMsg`. The session already holds that text (the
earlier turns); handing it over again would double the history with every reply.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

# An attribution line (or two: clients wrap long ones). `.` does not cross lines here.
_ATTRIBUTION = [
    re.compile(r"^\s*On\b.{0,300}\bwrote:\s*$", re.IGNORECASE),
    re.compile(r"^\s*在.{0,300}写道[:：]\s*$"),
    re.compile(r"^\s*-{2,}\s*(Original Message|原始邮件|Forwarded message)\s*-{2,}\s*$", re.IGNORECASE),
    re.compile(r"^\s*Le\b.{0,300}\ba écrit\s*:\s*$", re.IGNORECASE),
    re.compile(r"^\s*Am\b.{0,300}\bschrieb.{0,100}:\s*$", re.IGNORECASE),
]
# Outlook's header block of the quoted mail: "From: …" followed by "Sent: …" (or 发件人/发送时间).
_OUTLOOK_FROM = re.compile(r"^\s*\*?(From|发件人)\s*[:：]", re.IGNORECASE)
_OUTLOOK_SENT = re.compile(r"^\s*\*?(Sent|Date|发送时间|日期)\s*[:：]", re.IGNORECASE)


def _attribution_at(lines: list[str], i: int) -> bool:
    line = lines[i]
    if any(p.match(line) for p in _ATTRIBUTION):
        return True
    following = lines[i + 1] if i + 1 < len(lines) else ""
    if following and any(p.match(f"{line} {following}") for p in _ATTRIBUTION[:2]):
        return True  # wrapped over two lines
    return bool(_OUTLOOK_FROM.match(line) and _OUTLOOK_SENT.match(following))


def strip_plain(text: str) -> str:
    """The new text of a plain-text reply: up to the attribution, without `>` lines."""
    lines = text.replace("\r\n", "\n").split("\n")
    kept: list[str] = []
    for i, line in enumerate(lines):
        if _attribution_at(lines, i):
            break
        if line.lstrip().startswith(">"):
            continue
        kept.append(line)
    return "\n".join(kept).strip()


_BLOCKS = {"p", "div", "br", "tr", "li", "h1", "h2", "h3", "h4", "h5", "h6", "table", "ul", "ol", "pre"}
_SKIP_CLASSES = ("gmail_quote", "gmail_attr", "moz-cite-prefix", "yahoo_quoted")
_CUT_IDS = ("divrplyfwdmsg", "appendonsend")  # Outlook: everything after is the quoted mail
_VOID = {"br", "hr", "img", "meta", "link", "input", "area", "base", "col", "embed", "source", "wbr"}


class _Text(HTMLParser):
    """HTML to text, skipping quoted subtrees (and scripts/styles)."""

    def __init__(self, *, keep_quotes: bool = False) -> None:
        super().__init__(convert_charrefs=True)
        self.keep_quotes = keep_quotes
        self.out: list[str] = []
        self.skip: list[str] = []  # the open tags of the subtree skipped
        self.cut = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if self.cut:
            return
        if self.skip:
            if tag not in _VOID:
                self.skip.append(tag)
            return
        values = {k: (v or "") for k, v in attrs}
        classes = values.get("class", "").lower()
        quoted = not self.keep_quotes
        if quoted and values.get("id", "").lower() in _CUT_IDS:
            self.cut = True
            return
        if tag in ("script", "style", "head", "title") or (
            quoted and (tag == "blockquote" or any(c in classes for c in _SKIP_CLASSES))
        ):
            if tag not in _VOID:
                self.skip.append(tag)
            return
        if tag in _BLOCKS:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if self.cut:
            return
        if self.skip:
            if tag in self.skip:
                while self.skip and self.skip.pop() != tag:
                    pass
            return
        if tag in _BLOCKS:
            self.out.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.cut and not self.skip:
            self.out.append(data)


def html_text(html: str, *, keep_quotes: bool = False) -> str:
    """The new text of an HTML mail: quoted blocks left out, then as plain text (all of the
    text with `keep_quotes`)."""
    parser = _Text(keep_quotes=keep_quotes)
    parser.feed(html)
    parser.close()
    text = "".join(parser.out).replace("\xa0", " ")
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip() if keep_quotes else strip_plain(text)
