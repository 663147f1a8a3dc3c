"""`EMAIL_…` settings: addresses compared lower-case, domains as an allowlist of their own."""

from __future__ import annotations

from channels.email import EmailSettings


def test_domains_and_senders_add_up() -> None:
    settings = EmailSettings(  # type: ignore[call-arg]
        _env_file=None, allowed_senders="Alice@Example.com, bob@x.org", allowed_domains="@Example.COM"
    )
    assert settings.allowed_senders == ["alice@example.com", "bob@x.org"]
    assert settings.allowed_domains == ["example.com"]
    assert settings.access == "open"  # the domain filter before the inbox is the allowlist
    assert settings.sender_served("carol@example.com") and settings.sender_served("bob@x.org")
    assert not settings.sender_served("eve@example.net")


def test_without_domains_the_usual_access_rules_hold() -> None:
    settings = EmailSettings(_env_file=None, allowed_senders="a@example.com")  # type: ignore[call-arg]
    assert settings.access is None and settings.sender_served("eve@example.net")


def test_ports_and_logins_default_sensibly() -> None:
    settings = EmailSettings(  # type: ignore[call-arg]
        _env_file=None, address="bot@example.org", imap_host="mail.example.org", password="pw"
    )
    assert (settings.imap_port_or_default(), settings.smtp_port_or_default()) == (993, 587)
    assert settings.smtp_host_or_default() == "mail.example.org"
    assert settings.smtp_login() == ("bot@example.org", "pw")
    assert EmailSettings(_env_file=None, smtp_user="", smtp_security="tls").smtp_login() is None  # type: ignore[call-arg]
    assert EmailSettings(_env_file=None, smtp_security="tls").smtp_port_or_default() == 465  # type: ignore[call-arg]
