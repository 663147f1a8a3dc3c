"""The email tests' servers: one Dovecot for the module (a fresh mailbox per test) and an
SMTP server per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.smtp_sink import SmtpSink
from tests.support.dovecot import Dovecot, dovecot


@pytest.fixture(scope="session")
def imap_server() -> Iterator[Dovecot]:
    with dovecot() as server:
        yield server


@pytest.fixture
def smtp() -> Iterator[SmtpSink]:
    with SmtpSink() as sink:
        yield sink
