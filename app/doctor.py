"""`chatgate doctor` and `chatgate status`: one line per check, a table of what runs."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from pydantic import ValidationError
from sqlalchemy import func, select

from app.config import Settings

# Settings fields a channel cannot work without when unset (by name).
_CREDENTIAL_SUFFIXES = ("secret", "token")
CLOCK_SKEW_LIMIT_SECONDS = 60.0
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"  # the SDK's, when LLM_BASE_URL is unset
PROBE_TIMEOUT_SECONDS = 10.0


def model_settings_problem(settings: Settings) -> str | None:
    """Why the configured model cannot answer, as far as settings alone tell."""
    if settings.llm_provider == "openai" and not settings.llm_api_key and not settings.llm_base_url:
        return "LLM_PROVIDER=openai needs LLM_API_KEY (for api.openai.com) or LLM_BASE_URL (a local endpoint)"
    return None


def database_settings_problem(settings: Settings) -> str | None:
    """Why the database settings cannot work, as far as settings alone tell (one line)."""
    if settings.database_pooler == "pgbouncer" and not settings.bus_database_url:
        return (
            "DATABASE_POOLER=pgbouncer needs BUS_DATABASE_URL: LISTEN/NOTIFY cannot work through a pooler"
            " in transaction mode; give the session bus a direct connection to the primary"
        )
    return None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    warning: bool = False  # ok, but the operator should know (asynchronous replication)

    def line(self) -> str:
        return f"{'FAIL' if not self.ok else 'WARN' if self.warning else 'ok  '}  {self.name}: {self.detail}"


async def _database(settings: Settings) -> list[Check]:
    from app.db.engine import create_engine
    from app.migrate import current_revision, head_revision, permanent_failure

    engine = create_engine(settings)
    try:
        try:
            revision = await current_revision(engine)
        except Exception as exc:
            reason = permanent_failure(exc) or str(exc).strip().splitlines()[0]
            return [Check("database", False, f"not reachable: {reason}")]
        head = head_revision(settings.database_url)
        checks = [Check("database", True, f"reachable ({engine.url.get_backend_name()})")]
        if revision == head:
            checks.append(Check("schema", True, f"at head ({head})"))
        else:
            checks.append(
                Check("schema", False, f"at {revision or 'nothing'}, head is {head}: run `chatgate migrate`")
            )
        if not settings.is_sqlite:
            checks.append(await _replication(engine))
        return checks
    finally:
        await engine.dispose()


async def _replication(engine: Any) -> Check:
    from app.db.replication import replication

    try:
        verdict, detail = (await replication(engine)).verdict()
    except Exception as exc:  # a report, not a failure of the database check
        return Check("replication", True, f"unknown: {str(exc).strip().splitlines()[0]}", warning=True)
    return Check("replication", verdict != "fail", detail, warning=verdict == "warn")


async def _channels(settings: Settings, *, offline: bool) -> list[Check]:
    from channels import KNOWN_CHANNELS, load_spec

    checks = []
    for name in settings.channels:
        if name not in KNOWN_CHANNELS:
            checks.append(Check(f"channel {name}", False, f"unknown (known: {', '.join(KNOWN_CHANNELS)})"))
            continue
        spec = load_spec(name)
        try:
            channel_settings = spec.settings_class()
        except ValidationError as exc:
            checks.append(Check(f"channel {name}", False, format_validation_error(exc, spec.settings_class)))
            continue
        if spec.doctor is not None:  # the channel checks itself (e.g. a login kept in the database)
            try:
                ok, detail = await spec.doctor(settings, channel_settings)
            except Exception as exc:
                ok, detail = False, f"check failed: {exc!r}"
            checks.append(Check(f"channel {name}", ok, detail))
            continue
        prefix = str(spec.settings_class.model_config.get("env_prefix", ""))
        unset = [
            (prefix + field).upper()
            for field in type(channel_settings).model_fields
            if field.endswith(_CREDENTIAL_SUFFIXES) and getattr(channel_settings, field) in (None, "")
        ]
        if unset:
            checks.append(Check(f"channel {name}", False, f"unset: {', '.join(unset)}"))
            continue
        probe = None if offline else _probe(KNOWN_CHANNELS[name])
        if probe is None:
            checks.append(Check(f"channel {name}", True, "settings complete"))
            continue
        checks.append(await _run_probe(name, probe, channel_settings))
    return checks


def _probe(package: str) -> Any:
    """The channel's live credential check (`<package>.probe.probe`), if it has one."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{package}.probe") is None:
        return None
    return importlib.import_module(f"{package}.probe").probe


async def _run_probe(name: str, probe: Any, channel_settings: Any) -> Check:
    from app.probe import CredentialsRejected

    try:
        async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_SECONDS) as client:
            learnt = await probe(channel_settings, client)
    except CredentialsRejected as exc:
        return Check(f"channel {name}", False, str(exc))
    return Check(f"channel {name}", True, f"credentials accepted ({learnt})")


async def _model(settings: Settings, *, offline: bool) -> tuple[Check, datetime | None]:
    if settings.llm_provider == "offline":
        return Check("model", True, "offline provider (built in, no endpoint)"), None
    problem = model_settings_problem(settings)
    if problem is not None:
        return Check("model", False, problem), None
    if offline:
        return Check("model", True, "settings complete (endpoint not asked: --offline)"), None
    url = (settings.llm_base_url or OPENAI_DEFAULT_BASE_URL).rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return Check("model", False, f"{url} not answering: {exc!r}"), None
    date = response.headers.get("date")
    server_time = parsedate_to_datetime(date) if date else None
    if response.status_code != 200:
        return Check("model", False, f"{url} answered {response.status_code}"), server_time
    listed = _model_ids(response)
    if listed is not None and settings.llm_model not in listed:
        shown = ", ".join(sorted(listed)[:10]) or "none"
        detail = f"{url} answered 200 but does not list LLM_MODEL={settings.llm_model} (listed: {shown})"
        return Check("model", False, detail), server_time
    return Check("model", True, f"{url} answered 200"), server_time


def _model_ids(response: httpx.Response) -> set[str] | None:
    """The model ids an OpenAI-style `/models` answer lists, or None when it lists none
    readable (some proxies answer without a list: then the name is not checked)."""
    try:
        data = response.json().get("data")
    except (ValueError, AttributeError):
        return None
    if not isinstance(data, list) or not data:
        return None
    return {str(item["id"]) for item in data if isinstance(item, dict) and "id" in item}


def _secrets(settings: Settings) -> list[Check]:
    checks = [
        Check(
            "secret ADMIN_TOKEN",
            bool(settings.admin_token),
            "set" if settings.admin_token else "unset: the admin API and dashboard are off",
        )
    ]
    if "browser" not in settings.channels:
        return checks  # the chat page is not served: its tokens are not needed
    chat = bool(settings.gateway_tokens or settings.gateway_token_secret)
    checks.append(
        Check(
            "browser chat tokens",
            chat,
            "set" if chat else "unset: set GATEWAY_TOKENS or GATEWAY_TOKEN_SECRET to open the chat page",
        )
    )
    return checks


# Channels the banner already has a line of its own for.
_BANNER_OWN_LINE = frozenset({"webhook", "browser"})
BANNER_PROBE_SECONDS = 5.0


async def channel_states(channel_settings: Mapping[str, Any], engine: Any, owner: str) -> list[str]:
    """A banner line per served channel: its credentials as the platform judged them just
    now (for channels that can be asked) and who holds its long-lived connections."""
    import asyncio

    from app.connection_leases import list_holds
    from app.db.models import utcnow
    from channels import KNOWN_CHANNELS

    names = [n for n in channel_settings if n not in _BANNER_OWN_LINE and n in KNOWN_CHANNELS]
    if not names:
        return []
    probes = {n: _probe(KNOWN_CHANNELS[n]) for n in names}

    async def judged(name: str) -> str:
        probe = probes[name]
        if probe is None:
            return "settings only"
        try:
            check = await asyncio.wait_for(
                _run_probe(name, probe, channel_settings[name]), BANNER_PROBE_SECONDS
            )
        except TimeoutError:
            return "credentials not checked (platform slow to answer)"
        return check.detail if check.ok else f"CREDENTIALS REFUSED: {check.detail}"

    verdicts = await asyncio.gather(*(judged(n) for n in names))
    holds = await list_holds(engine)
    now = utcnow()
    lines = ["  channels:"]
    for name, verdict in zip(names, verdicts, strict=True):
        conns = []
        for hold in holds:
            if hold.name.split(":", 1)[0] != name:
                continue
            holder = (
                "none yet" if not hold.held(now) else "this replica" if hold.owner == owner else hold.owner
            )
            conns.append(f"connection {hold.name} held by {holder}")
        lines.append(f"    {name + ':':<13} {'; '.join([verdict, *conns])}")
    return lines


def _clock(reference: datetime | None) -> Check:
    now = datetime.now(UTC)
    if now.year < 2024:
        return Check("clock", False, f"system time {now.isoformat()} is in the past")
    if reference is None:
        return Check("clock", True, f"{now.isoformat(timespec='seconds')} (no reference to compare)")
    skew = (now - reference).total_seconds()
    ok = abs(skew) <= CLOCK_SKEW_LIMIT_SECONDS
    return Check("clock", ok, f"{skew:+.0f} s from the model endpoint's clock")


async def doctor(settings: Settings, *, offline: bool = False) -> list[Check]:
    """Every check, each part only when it is in use; `offline` skips the requests to the
    platforms and the model endpoint."""
    checks = [Check("settings", False, problem)] if (problem := database_settings_problem(settings)) else []
    checks += await _database(settings)
    checks += await _channels(settings, offline=offline)
    model, reference = await _model(settings, offline=offline)
    checks.append(model)
    checks += _secrets(settings)
    checks.append(_clock(reference))
    return checks


async def status(settings: Settings) -> dict[str, Any]:
    """What the running deployment does, read from its database (not from the settings of
    the shell this is typed in): the channels with traffic or connections, the backlog,
    sessions, the workers holding session leases and who holds each platform connection."""
    from datetime import timedelta

    from app.connection_leases import list_holds
    from app.db.engine import create_engine
    from app.db.models import session_keys, utcnow
    from app.sessions import stats

    engine = create_engine(settings)
    try:
        counts = await stats.status_counts(engine)
        now = utcnow()
        async with engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(session_keys.c.lease_owner, func.count())
                    .where(session_keys.c.lease_owner.is_not(None), session_keys.c.lease_expires_at > now)
                    .group_by(session_keys.c.lease_owner)
                )
            ).all()
        activity = await stats.channel_activity(engine, since=now - timedelta(hours=1))
        holds = await list_holds(engine)
        return {
            "database": engine.url.get_backend_name(),
            "channels": [
                {
                    "channel": name,
                    "inbound_last_hour": act["inbound_recent"],
                    "outbound_last_hour": act["outbound_recent"],
                    "last_inbound_at": act["last_inbound_at"],
                }
                for name, act in sorted(activity.items())
            ],
            "connections": [
                {
                    "connection": h.name,
                    "owner": h.owner if h.held(now) else None,
                    "expires_at": h.expires_at,
                    "takeovers": h.takeovers,
                }
                for h in holds
            ],
            "backlog": {
                "inbox_pending": counts["inbox"].get("pending", 0) + counts["inbox"].get("processing", 0),
                "outbox_pending": counts["outbox"].get("pending", 0) + counts["outbox"].get("sending", 0),
                "inbox_failed": counts["inbox"].get("failed", 0),
                "outbox_failed": counts["outbox"].get("failed", 0),
            },
            "workers": [{"worker": owner, "leases": n} for owner, n in rows],
            "sessions": counts["sessions"],
        }
    finally:
        await engine.dispose()


async def server_status(url: str, admin_token: str) -> dict[str, Any]:
    """What one running server says of itself through its admin API: the channels it
    serves with their health and connection owners, its backlog and sessions."""
    headers = {"Authorization": f"Bearer {admin_token}"}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers, timeout=10) as client:
        channels = await client.get("/admin/api/channels")
        overview = await client.get("/admin/api/overview")
    for response in (channels, overview):
        if response.status_code != 200:
            raise StatusUnavailable(f"{response.request.url} answered {response.status_code}")
    served = [c for c in channels.json()["channels"] if c["enabled"]]
    data = overview.json()
    return {
        "server": url,
        "channels": [
            {
                "channel": c["name"],
                "health": c["health"],
                "inbound_last_hour": c["inbound_recent"],
                "connections": [{"connection": h["name"], "owner": h["owner"]} for h in c["connections"]],
            }
            for c in served
        ],
        "backlog": data["backlog"],
        "sessions": data["sessions"],
    }


class StatusUnavailable(Exception):
    """The server could not be asked (down, wrong URL, wrong admin token)."""


def format_validation_error(exc: ValidationError, model: type[Any] | None = None) -> str:
    """One readable line per error, naming the environment variable."""
    prefix = ""
    if model is not None:
        prefix = str(getattr(model, "model_config", {}).get("env_prefix", ""))
    hidden = bool(getattr(model, "model_config", {}).get("hide_input_in_errors")) if model else False
    parts = []
    for error in exc.errors():
        loc = [str(p) for p in error["loc"]]
        secret = hidden or any(_SECRET.search(p) for p in loc[:1])
        # A secret's value is never shown, nor a key inside it (a token is a dict key).
        name = (prefix + "_".join(loc[:1] if secret else loc)).upper() or "settings"
        value = error.get("input")
        # A setting that holds credentials (A2A_TOKENS, OPENAI_API_TOKENS, a secret) is
        # never quoted back: the log of a failed start must not hold them.
        secret = secret or any(word in name for word in ("TOKEN", "SECRET", "PASSWORD", "KEY"))
        shown = f" (got {value!r})" if isinstance(value, str | int | float) and not secret else ""
        parts.append(f"{name}: {error['msg']}{shown}")
    return "; ".join(parts)


# Settings whose values are credentials: errors about them name the setting only.
_SECRET = re.compile(r"token|secret|password|key|credential|dsn|database_url", re.IGNORECASE)
