"""`chatgate doctor` and `chatgate status`: one line per check, a table of what runs."""

from __future__ import annotations

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


def model_settings_problem(settings: Settings) -> str | None:
    """Why the configured model cannot answer, as far as settings alone tell."""
    if settings.llm_provider == "openai" and not settings.llm_api_key and not settings.llm_base_url:
        return "LLM_PROVIDER=openai needs LLM_API_KEY (for api.openai.com) or LLM_BASE_URL (a local endpoint)"
    return None


@dataclass
class Check:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'ok  ' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


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
        reachable = Check("database", True, f"reachable ({engine.url.get_backend_name()})")
        if revision == head:
            return [reachable, Check("schema", True, f"at head ({head})")]
        return [
            reachable,
            Check("schema", False, f"at {revision or 'nothing'}, head is {head}: run `chatgate migrate`"),
        ]
    finally:
        await engine.dispose()


def _channels(settings: Settings) -> list[Check]:
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
        prefix = str(spec.settings_class.model_config.get("env_prefix", ""))
        unset = [
            (prefix + field).upper()
            for field in type(channel_settings).model_fields
            if field.endswith(_CREDENTIAL_SUFFIXES) and getattr(channel_settings, field) in (None, "")
        ]
        if unset:
            checks.append(Check(f"channel {name}", False, f"unset: {', '.join(unset)}"))
        else:
            checks.append(Check(f"channel {name}", True, "settings complete"))
    return checks


async def _model(settings: Settings) -> tuple[Check, datetime | None]:
    if settings.llm_provider == "offline":
        return Check("model", True, "offline provider (built in, no endpoint)"), None
    problem = model_settings_problem(settings)
    if problem is not None:
        return Check("model", False, problem), None
    url = (settings.llm_base_url or OPENAI_DEFAULT_BASE_URL).rstrip("/") + "/models"
    headers = {"Authorization": f"Bearer {settings.llm_api_key}"} if settings.llm_api_key else {}
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            response = await client.get(url, headers=headers)
    except httpx.HTTPError as exc:
        return Check("model", False, f"{url} not answering: {exc!r}"), None
    date = response.headers.get("date")
    server_time = parsedate_to_datetime(date) if date else None
    if response.status_code == 200:
        return Check("model", True, f"{url} answered 200"), server_time
    return Check("model", False, f"{url} answered {response.status_code}"), server_time


def _secrets(settings: Settings) -> list[Check]:
    checks = [
        Check(
            "secret ADMIN_TOKEN",
            bool(settings.admin_token),
            "set" if settings.admin_token else "unset: the admin API and dashboard are off",
        )
    ]
    chat = bool(settings.gateway_tokens or settings.gateway_token_secret)
    checks.append(
        Check(
            "browser chat tokens",
            chat,
            "set" if chat else "unset: set GATEWAY_TOKENS or GATEWAY_TOKEN_SECRET to open the chat page",
        )
    )
    return checks


def _clock(reference: datetime | None) -> Check:
    now = datetime.now(UTC)
    if now.year < 2024:
        return Check("clock", False, f"system time {now.isoformat()} is in the past")
    if reference is None:
        return Check("clock", True, f"{now.isoformat(timespec='seconds')} (no reference to compare)")
    skew = (now - reference).total_seconds()
    ok = abs(skew) <= CLOCK_SKEW_LIMIT_SECONDS
    return Check("clock", ok, f"{skew:+.0f} s from the model endpoint's clock")


async def doctor(settings: Settings) -> list[Check]:
    checks = await _database(settings)
    checks += _channels(settings)
    model, reference = await _model(settings)
    checks.append(model)
    checks += _secrets(settings)
    checks.append(_clock(reference))
    return checks


async def status(settings: Settings) -> dict[str, Any]:
    """What runs (lease owners), the backlog, the leases held and the bus listeners."""
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
        return {
            "database": engine.url.get_backend_name(),
            "channels": settings.channels,
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


def format_validation_error(exc: ValidationError, model: type[Any] | None = None) -> str:
    """One readable line per error, naming the environment variable."""
    prefix = ""
    if model is not None:
        prefix = str(getattr(model, "model_config", {}).get("env_prefix", ""))
    parts = []
    for error in exc.errors():
        name = (prefix + "_".join(str(p) for p in error["loc"])).upper() or "settings"
        value = error.get("input")
        shown = f" (got {value!r})" if isinstance(value, str | int | float) else ""
        parts.append(f"{name}: {error['msg']}{shown}")
    return "; ".join(parts)
