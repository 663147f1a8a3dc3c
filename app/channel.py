"""The one seam between the core and platform adapters.

Adapters are thin (slack-bolt style): they see framework-neutral `ChannelRequest`
objects and answer `ChannelResponse`s; `app.api` does the conversion. An adapter
verifies and parses platform payloads into `InboundEvent`s, hands them to
`ChannelContext.accept` (which commits them to the inbox before returning), and sends
`OutboundMessage`s back. No adapter knows about the database, sessions or the agent.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, Protocol, runtime_checkable

import httpx
from pydantic import BaseModel, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app.connections import ConnectionRun, ConnectionStates, LocalConnections
from app.errors import InvalidPayload, UnsupportedMediaType
from app.events import BusyPolicy, InboundEvent, OutboundMessage, SessionScope
from app.fetch import GuardedFetcher


class ChannelSettings(BaseSettings):
    """Settings every channel has.

    Subclasses set `env_prefix` to the channel's URL name in upper case with `-` as `_`
    (`TELEGRAM_`, `WECHAT_MP_`). Whether a channel runs is the service setting `CHANNELS`.
    """

    model_config = SettingsConfigDict(env_file=".env", extra="ignore")
    # Whether the adapter deletes its own messages (an outbound `DELETE_KEY`): our answer to
    # a recalled message is then deleted too (`app.pipeline.platform_events`).
    deletes_messages: ClassVar[bool] = False

    session_scope: SessionScope = Field(SessionScope.CHAT, description="chat, thread or user_in_chat.")
    busy_policy: BusyPolicy = Field(BusyPolicy.QUEUE, description="queue, collect or steer.")
    allow_session_override: bool = Field(False, description="Honour session keys given by the client.")
    allowed_senders: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated sender ids; empty allows everyone."
    )
    allowed_chats: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated group/chat ids served; empty serves all."
    )
    require_mention_in_groups: bool = Field(
        True, description="In group chats answer only when the bot is mentioned or replied to."
    )
    answer_unknown_dm: bool = Field(
        False, description="With allowed_senders set, still answer direct messages from others."
    )
    # --- who may talk, and how much (app.access, docs/access.md) ---
    access: Literal["open", "allowlist", "pairing"] | None = Field(
        None,
        description="open, allowlist or pairing (unknown direct senders get a one-time code); "
        "unset: allowlist when allowed_senders is set, else open.",
    )
    pairing_code_ttl_seconds: float = Field(3600.0, gt=0, description="How long a pairing code is valid.")
    pairing_max_pending: int = Field(
        100, ge=1, description="Pending pairing codes at most; further unknown senders get none for now."
    )
    quota_sender_messages_per_minute: int | None = Field(
        None, ge=1, description="Messages per minute per sender; unset: no limit."
    )
    quota_session_messages_per_minute: int | None = Field(
        None, ge=1, description="Messages per minute per session; unset: no limit."
    )
    quota_sender_tokens_per_day: int | None = Field(
        None, ge=1, description="Model tokens per UTC day per sender; unset: no limit."
    )
    quota_session_tokens_per_day: int | None = Field(
        None, ge=1, description="Model tokens per UTC day per session; unset: no limit."
    )
    max_body_bytes: int = Field(1024 * 1024, description="Larger request bodies get 413.")
    locale: Literal["en", "zh"] = Field(
        "en", description="Language of the gateway's own texts here: en or zh."
    )
    suspend_after_seconds: float | None = Field(None, description="Overrides the global default.")
    expire_after_seconds: float | None = Field(None, description="Overrides the global default.")
    archive_after_seconds: float | None = Field(None, description="Overrides the global default.")
    llm_model: str | None = Field(None, description="Model for this channel's sessions.")
    # --- who is who in a group (app.access.roles, docs/access.md) ---
    admins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated sender ids with the admin role in this channel's groups.",
    )
    # --- platform-native events: edits, recalls, reactions, joins (docs/events.md) ---
    edit_policy: Literal["annotate", "rerun"] = Field(
        "annotate",
        description="An answered message edited: annotate (the model is told on the next turn) "
        "or rerun (answered again). A message still queued is always replaced by its edit.",
    )
    welcome_text: str = Field(
        "",
        description="Said when a member joins a group ({name} is their name); empty: nothing.",
    )
    farewell_text: str = Field(
        "",
        description="Said when a member leaves a group ({name} is their name); empty: nothing.",
    )
    conversation_commands: Literal["admin", "member"] = Field(
        "admin",
        description="Who may run commands that change a group's shared conversation "
        "(/new /reset /undo /model …): admin, or member to open them to everyone.",
    )
    tool_roles: dict[str, str] = Field(
        default_factory=dict,
        description='JSON {"<tool name or glob>": "<role>"}: the least role (guest, member, admin, '
        "owner) a tool needs here, instead of the role the tool declares (member by default).",
    )
    role_cache_seconds: float = Field(
        60.0, gt=0, description="How long a role the platform reported (a lookup) is trusted."
    )
    approvers: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated sender ids allowed to /approve."
    )
    approve_own_requests_in_direct: bool = Field(
        False, description="In direct chats, the person talking to the bot may /approve its tool calls."
    )
    tools_allow: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tool names/globs offered here; empty allows all."
    )
    tools_deny: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Comma-separated tool names/globs never offered here."
    )
    tools_by_sender: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict,
        description='JSON {"<sender id>": {"allow": [...], "deny": [...]}}; replaces the channel lists '
        "for that sender.",
    )

    @field_validator(
        "allowed_senders", "allowed_chats", "admins", "approvers", "tools_allow", "tools_deny", mode="before"
    )
    @classmethod
    def _comma_list(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    def sender_allowed(self, sender_id: str) -> bool:
        return not self.allowed_senders or sender_id in self.allowed_senders

    def chat_allowed(self, chat_id: str) -> bool:
        return not self.allowed_chats or chat_id in self.allowed_chats


@dataclass(frozen=True)
class ChannelRequest:
    """An HTTP request to `/channels/{channel}/{path}`; header names are lower-case."""

    method: str
    path: str
    headers: Mapping[str, str]
    query: Mapping[str, str]
    body: bytes
    client: str | None = None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").split(";")[0].strip().lower()

    def json(self) -> Any:
        """Parse the body as JSON, refusing other content types."""
        if self.content_type != "application/json":
            raise UnsupportedMediaType(
                f"expected Content-Type application/json, got {self.content_type or 'none'!r}"
            )
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InvalidPayload(f"body is not valid JSON: {exc}") from exc
        except RecursionError as exc:
            raise InvalidPayload("body is nested too deeply") from exc


@dataclass
class ChannelResponse:
    status: int = 200
    body: bytes | str | dict[str, Any] | list[Any] | None = None
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> ChannelResponse:
        return cls(status=status, body=data, content_type="application/json")

    @classmethod
    def text(cls, text: str, status: int = 200) -> ChannelResponse:
        return cls(status=status, body=text, content_type="text/plain; charset=utf-8")


@runtime_checkable
class ChannelWebSocket(Protocol):
    """A WebSocket a platform opened to us (OneBot reverse WS)."""

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def query(self) -> Mapping[str, str]: ...

    async def accept(self) -> None: ...
    async def receive_text(self) -> str: ...
    async def send_text(self, data: str) -> None: ...
    async def close(self, code: int = 1000, reason: str = "") -> None: ...


class AcceptResult(BaseModel):
    """What the inbox said about one event: stored now, or seen before."""

    event_id: str
    session_key: str
    duplicate: bool = False
    skipped: bool = False  # not stored: sender not allowed by the channel's policy
    # Why it was skipped (not_allowed, pairing, quota) and what the sender was told, if anything.
    reason: str | None = None
    notice: str | None = None


class Reply(BaseModel):
    """A reply produced for an event, as synchronous channels return it."""

    message_id: str
    text: str
    parts: list[dict[str, Any]] = Field(default_factory=list)
    status: str
    # For the event's sender only (`PRIVATE_NOTICE_KEY`): a platform that answers the event's
    # own request (a Feishu card callback, a Discord interaction) shows it privately.
    private: bool = False


class WaitResult(BaseModel):
    done: bool
    replies: list[Reply] = Field(default_factory=list)


@dataclass(frozen=True)
class EventStatus:
    """What the inbox knows about one stored event (for channels that report progress: A2A)."""

    event_id: str
    channel: str
    session_key: str
    status: str  # pending, processing, done, failed
    attempts: int
    error: str | None
    metadata: dict[str, Any]
    text: str
    created_at: datetime
    updated_at: datetime
    awaiting_approval: bool = False  # a tool call of the session waits for /approve
    replies: list[Reply] = field(default_factory=list)
    # The model tokens of the run that handled the event (0 before it ran; shared by the
    # events one run answered together).
    prompt_tokens: int = 0
    completion_tokens: int = 0


class EventReader(Protocol):
    """Reads stored events of one channel; the one write is `cancel_pending`."""

    async def status(self, event_id: str) -> EventStatus | None: ...
    async def find(self, external_id: str) -> str | None:
        """The event id stored under the platform id `external_id`, if any."""
        ...

    async def list_ids(
        self,
        key_prefix: str,
        *,
        external_prefix: str = "",
        limit: int = 50,
        before: int | None = None,
        updated_after: datetime | None = None,
    ) -> list[tuple[int, str, str]]:
        """(row id, event id, session key) of stored events under a session-key prefix, newest first."""
        ...

    async def count(self, session_key: str) -> int:
        """How many events of this channel were stored for the session key."""
        ...

    async def cancel_pending(self, event_id: str) -> bool:
        """Cancel the event if no turn has taken it yet (it then never runs); whether it was."""
        ...


class _NoEvents:
    async def status(self, event_id: str) -> EventStatus | None:
        return None

    async def find(self, external_id: str) -> str | None:
        return None

    async def list_ids(
        self,
        key_prefix: str,
        *,
        external_prefix: str = "",
        limit: int = 50,
        before: int | None = None,
        updated_after: datetime | None = None,
    ) -> list[tuple[int, str, str]]:
        return []

    async def count(self, session_key: str) -> int:
        return 0

    async def cancel_pending(self, event_id: str) -> bool:
        return False


@dataclass(frozen=True)
class ChannelRecord:
    """One of a channel's own records (`RecordStore`)."""

    key: str
    owner: str | None
    data: dict[str, Any]
    open: bool  # still watched (e.g. a task not finished)


class RecordStore(Protocol):
    """A channel's own small durable records, and messages it hands the outbox itself
    (`app.channel_records`); scoped to the channel."""

    async def put(
        self, kind: str, key: str, data: dict[str, Any], *, owner: str | None = None, open: bool = True
    ) -> None: ...
    async def get(self, kind: str, key: str) -> ChannelRecord | None: ...
    async def with_prefix(self, kind: str, prefix: str, limit: int = 100) -> list[ChannelRecord]: ...
    async def open_records(self, kind: str, limit: int = 500) -> list[ChannelRecord]: ...
    async def remove(self, kind: str, key: str) -> bool: ...
    async def deliver(self, messages: Sequence[OutboundMessage]) -> None:
        """Into the outbox once per message id; sent through the channel's `send`."""
        ...

    async def delivery_failed(self, platform_message_id: str, error: str) -> bool:
        """The platform reported later that a sent message did not arrive (WhatsApp's
        `failed` status): its outbox row becomes failed with `error`; whether one was found."""
        ...


@dataclass(frozen=True)
class AgentListing:
    """One of the gateway's agents as a channel may show it (A2A's per-agent cards)."""

    name: str
    description: str = ""
    skills: tuple[tuple[str, str], ...] = ()  # (name, description) of the skills it may load
    default: bool = False
    users: tuple[str, ...] = ()  # who may use it (sender ids); empty: everyone


@dataclass
class ChannelContext:
    """What the core gives an adapter."""

    accept: Callable[[Sequence[InboundEvent]], Awaitable[list[AcceptResult]]]
    wait_for_replies: Callable[[str, float], Awaitable[WaitResult]]
    http: httpx.AsyncClient
    # Run a long-lived platform connection while this process holds it (`app.connections`).
    hold_connection: Callable[[str, ConnectionRun], Awaitable[None]] = field(
        default_factory=lambda: LocalConnections().hold_connection
    )
    # State a connection's holder keeps for the next one (`app.connections.ConnectionStates`).
    connection_state: ConnectionStates = field(default_factory=LocalConnections)
    # Read-only view of this channel's stored events (`app.event_reader`).
    events: EventReader = field(default_factory=_NoEvents)
    # Speech to text (audio bytes, file name, MIME type, the event whose voice note it is)
    # → transcript, its seconds recorded as that sender's usage; None when STT is off.
    transcribe: Callable[[bytes, str, str, InboundEvent], Awaitable[str]] | None = None
    # The channel's own durable records and outbox hand-off (`app.channel_records`); None
    # where nothing is stored (tests building a bare context).
    records: RecordStore | None = None
    # The gateway's agents when there are several (`AGENTS_FILE`); empty with one agent.
    agents: Sequence[AgentListing] = ()
    # Whether received documents are kept in the session's workspace (per-session
    # workspaces are on): then a channel downloads every file, not only images.
    keeps_files: bool = False
    # Every URL a payload controls (a media segment's URL, a push URL) is fetched through
    # it (`app.fetch`): private addresses refused, redirects checked, decoded bytes capped.
    fetcher: GuardedFetcher = field(default_factory=GuardedFetcher)


@dataclass(frozen=True)
class SendResult:
    platform_message_id: str | None = None


class ChannelAdapter(Protocol):
    """A platform adapter. HTTP and WebSocket handling are optional capabilities."""

    @property
    def name(self) -> str: ...

    @property
    def settings(self) -> ChannelSettings: ...

    async def start(self) -> None:
        """Begin background work (polling, sockets). Called once after the app started."""

    async def stop(self) -> None:
        """Stop background work and release clients."""

    async def send(self, message: OutboundMessage) -> SendResult:
        """Deliver one message; raise a `DeliveryError` subclass on failure."""
        ...


def delivers(adapter: ChannelAdapter) -> bool:
    """Whether `adapter.send` has anything to do.

    An adapter whose replies are only read (the webhook channel without a callback URL:
    `?wait=true`, the admin API) sets `delivers = False`; its replies are then stored as
    sent, and the outbox sender never claims them.
    """
    return bool(getattr(adapter, "delivers", True))


@dataclass(frozen=True)
class ConnectionConflicts:
    """How the platform answers this replica's long-lived connection: `streak` refusals in
    a row as a conflict (Telegram's getUpdates 409: another poller with the token, or a
    webhook set), `detail` what the last one said; a streak of 0 when it answers."""

    streak: int
    detail: str = ""


@runtime_checkable
class ReportsConflicts(Protocol):
    """An adapter whose connection a platform can refuse as a conflict (`app.alerts`)."""

    def connection_conflicts(self) -> ConnectionConflicts | None:
        """None while this replica does not run the connection (it cannot know)."""
        ...


@runtime_checkable
class HttpChannel(Protocol):
    async def handle_request(self, request: ChannelRequest) -> ChannelResponse: ...


@runtime_checkable
class WebSocketChannel(Protocol):
    async def handle_websocket(self, path: str, ws: ChannelWebSocket) -> None: ...


@dataclass(frozen=True)
class ChannelSpec:
    """How the core finds, configures and builds a channel (`channels/<name>/__init__.py`)."""

    name: str
    settings_class: type[ChannelSettings]
    factory: Callable[[Any, ChannelContext], ChannelAdapter]
    # `chatgate doctor`'s own check of the channel (app settings, channel settings) → (ok,
    # detail), for what settings alone do not tell (a login stored in the database).
    doctor: Callable[[Any, Any], Awaitable[tuple[bool, str]]] | None = None
