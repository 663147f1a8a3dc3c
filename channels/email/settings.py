"""Settings of the email channel (`EMAIL_…`): one IMAP mailbox in, SMTP out."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from app.channel import ChannelSettings
from app.streaming.protocol import StreamingMode
from app.streaming.settings import StreamingSettings
from channels.common.media import MediaSettings

Security = Literal["tls", "starttls", "none"]


class EmailSettings(StreamingSettings, MediaSettings, ChannelSettings):
    model_config = SettingsConfigDict(env_prefix="EMAIL_", env_file=".env", extra="ignore")
    # A mail cannot be edited or show typing: the answer is one message.
    streaming_modes: ClassVar[frozenset[StreamingMode]] = frozenset({StreamingMode.OFF})
    streaming: StreamingMode = Field(StreamingMode.OFF, description="off (a mail is sent once, complete).")
    # A thread is a conversation with the people in it: no mention needed.
    require_mention_in_groups: bool = Field(
        False, description="Mail has no mentions: every mail is for the bot."
    )

    address: str | None = Field(
        None, description="The bot's address: the mailbox's, and the From of every answer."
    )
    from_name: str = Field("", description="Display name in the From of answers (empty: the address only).")
    imap_host: str | None = Field(None, description="IMAP server of the mailbox.")
    imap_port: int | None = Field(
        None, ge=1, le=65535, description="IMAP port; unset: 993 with tls, else 143."
    )
    # aioimaplib has no STARTTLS: IMAPS (993) is what every provider offers anyway.
    imap_security: Literal["tls", "none"] = Field(
        "tls", description="tls (IMAPS) or none (trusted networks only)."
    )
    imap_user: str | None = Field(None, description="IMAP login; unset: the address.")
    password: str | None = Field(
        None, description="Password of the IMAP login (and of SMTP, unless set apart)."
    )
    mailbox: str = Field("INBOX", description="The folder read for new mail.")
    smtp_host: str | None = Field(
        None, description="SMTP server answers are sent through; unset: the IMAP host."
    )
    smtp_port: int | None = Field(
        None, ge=1, le=65535, description="SMTP port; unset: 465 with tls, 587 with starttls, else 25."
    )
    smtp_security: Security = Field("starttls", description="tls (SMTPS), starttls or none.")
    smtp_user: str | None = Field(None, description="SMTP login; unset: the IMAP login; empty: no AUTH.")
    smtp_password: str | None = Field(None, description="SMTP password; unset: EMAIL_PASSWORD.")
    idle: bool = Field(
        True, description="Wait for new mail with IMAP IDLE where the server has it; else poll."
    )
    idle_seconds: float = Field(
        600.0,
        gt=0,
        le=1740,
        description="One IDLE at most this long (RFC 2177: under 29 minutes), then again.",
    )
    poll_seconds: float = Field(30.0, gt=0, description="Without IDLE: how often the mailbox is looked at.")
    retry_seconds: float = Field(10.0, ge=0, description="Wait after a failed IMAP connection.")
    timeout_seconds: float = Field(30.0, gt=0, description="Timeout of one IMAP or SMTP command.")
    process_existing: bool = Field(
        False,
        description="On the first start (no saved position, or the mailbox was recreated: a new "
        "UIDVALIDITY), also answer the mail already in it; default: only mail arriving from then on.",
    )
    mark_seen: bool = Field(True, description="Flag each mail read by the bot \\Seen in the mailbox.")
    max_message_bytes: int = Field(
        25_000_000, ge=1, description="Larger mails are not downloaded; the sender is told (politely)."
    )
    allowed_domains: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated sender domains served; with it set, mail from other domains (and not "
        "in EMAIL_ALLOWED_SENDERS) is ignored before anything is stored.",
    )
    dkim_private_key: str | None = Field(
        None,
        description="PEM private key answers are DKIM-signed with (the text, or a file's path); "
        "unset: unsigned.",
    )
    dkim_selector: str | None = Field(
        None, description="DKIM selector (the DNS record <selector>._domainkey.<domain>)."
    )
    dkim_domain: str | None = Field(
        None, description="DKIM signing domain (d=); unset: the address's domain."
    )

    @field_validator("allowed_domains", mode="before")
    @classmethod
    def _domains(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = value.split(",")
        if isinstance(value, list):
            return [str(v).strip().lower().lstrip("@") for v in value if str(v).strip()]
        return value

    @field_validator("allowed_senders", mode="after")
    @classmethod
    def _lower_senders(cls, value: list[str]) -> list[str]:
        return [v.lower() for v in value]  # sender ids are lower-case addresses

    @model_validator(mode="after")
    def _domain_access(self) -> EmailSettings:
        # The domains are an allowlist of their own, checked before the inbox: the gateway's
        # access check then lets their senders in (or EMAIL_ALLOWED_SENDERS alone would refuse them).
        if self.allowed_domains and self.access is None:
            self.access = "open"
        return self

    # --- derived ----------------------------------------------------------------------

    def imap_login(self) -> str:
        return self.imap_user or self.address or ""

    def imap_port_or_default(self) -> int:
        return self.imap_port or (993 if self.imap_security == "tls" else 143)

    def smtp_host_or_default(self) -> str:
        return self.smtp_host or self.imap_host or ""

    def smtp_port_or_default(self) -> int:
        return self.smtp_port or {"tls": 465, "starttls": 587, "none": 25}[self.smtp_security]

    def smtp_login(self) -> tuple[str, str] | None:
        user = self.smtp_user if self.smtp_user is not None else self.imap_login()
        if not user:
            return None
        password = self.smtp_password if self.smtp_password is not None else self.password
        return user, password or ""

    def sender_served(self, address: str) -> bool:
        """Whether the domain filter lets mail from `address` in (the gateway's access check follows)."""
        if not self.allowed_domains or address in self.allowed_senders:
            return True
        return address.rpartition("@")[2] in self.allowed_domains
