"""The effective configuration as an operator may see it: every secret redacted.

A setting is secret when its type is `SecretStr`/`SecretBytes`, when its field says so
(`json_schema_extra={"secret": True}`), or when its name says so (`…token`, `…secret`,
`…password`, `…api_key`, `…aes_key`, `…encrypt_key`, `…private_key`, `credentials`) and
it holds text or structures rather than a number or a flag (`gateway_token_ttl_seconds`
is not a secret). Inside structured values (`gateway_tokens`, `mcp_servers`) keys with
such names, and `headers`/`env` maps, are redacted too, and a password in any URL
(`database_url`) is replaced, as is the value of a query parameter with such a name
(`https://hook.example/cb?token=…`, `?key=…`, `?sig=…`). A redacted value is
`REDACTED`; an unset one stays `null`, so the page still tells "set" from "not set".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin
from urllib.parse import unquote_plus, urlsplit, urlunsplit

from pydantic import BaseModel, SecretBytes, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

REDACTED = "••••••"

_SECRET_NAME = re.compile(
    r"(^|_)(token|tokens|secret|secrets|password|passwd|api_key|aes_key|encrypt_key|private_key"
    r"|credential|credentials|authorization|cookie)($|_)",
    re.IGNORECASE,
)
_OPAQUE_KEYS = {"headers", "env", "environment"}
_URL_WITH_PASSWORD = re.compile(r"^[a-z][a-z0-9+.-]*://[^/@\s]*:[^/@\s]*@", re.IGNORECASE)
_URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)
# Query parameter names that carry credentials in callback and webhook URLs.
_SECRET_PARAM = re.compile(
    r"token|secret|passw|key|sig|auth|credential|session|ticket|access|code", re.IGNORECASE
)


def _types(annotation: Any) -> set[Any]:
    """The types a field may hold: containers and leaves, unions flattened."""
    args = get_args(annotation)
    if not args:
        return {annotation}
    origin = get_origin(annotation)
    found = set() if origin in (Union, UnionType, Annotated) else {origin}
    for arg in args:
        found |= _types(arg)
    return found


def is_secret_field(name: str, field: FieldInfo) -> bool:
    types = _types(field.annotation)
    if types & {SecretStr, SecretBytes}:
        return True
    extra = field.json_schema_extra
    if isinstance(extra, Mapping) and extra.get("secret"):
        return True
    scalar_only = types <= {int, float, bool, type(None)}
    return bool(_SECRET_NAME.search(name)) and not scalar_only


def _redact_query(value: str) -> str:
    """Each secret-named parameter's value replaced; the rest kept as written."""
    parts = urlsplit(value)
    if not parts.query:
        return value
    pieces = []
    for piece in parts.query.split("&"):
        name, eq, given = piece.partition("=")
        secret = eq and given and _SECRET_PARAM.search(unquote_plus(name))
        pieces.append(f"{name}={REDACTED}" if secret else piece)
    return urlunsplit(parts._replace(query="&".join(pieces)))


def _redact_url(value: str) -> str:
    if not _URL.match(value):
        return value
    try:
        value = _redact_query(value)
    except ValueError:  # not a URL after all (an invalid port, a bad IPv6 literal)
        return value
    if not _URL_WITH_PASSWORD.match(value):
        return value
    parts = urlsplit(value)
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}:{REDACTED}@{host}{port}"))


def redact_value(value: Any) -> Any:
    """A plain value with secrets inside it (by key name, or a URL's password) removed."""
    if isinstance(value, SecretStr | SecretBytes):
        return REDACTED
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            key = str(k)
            secret = bool(_SECRET_NAME.search(key)) or key.lower() in _OPAQUE_KEYS
            out[key] = (REDACTED if v not in (None, "", [], {}) else v) if secret else redact_value(v)
        return out
    if isinstance(value, list | tuple | set | frozenset):
        return [redact_value(v) for v in value]
    if isinstance(value, str):
        return _redact_url(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact_value(str(value))


def settings_view(settings: BaseSettings) -> list[dict[str, Any]]:
    """One entry per field: name, environment variable, value (redacted), secret, default."""
    prefix = str(settings.model_config.get("env_prefix") or "")
    rows = []
    for name, field in type(settings).model_fields.items():
        value = getattr(settings, name)
        secret = is_secret_field(name, field)
        if secret:
            shown = REDACTED if value not in (None, "", [], {}) else value
            if isinstance(shown, list | dict):
                shown = REDACTED
        else:
            shown = redact_value(value)
        default = field.get_default(call_default_factory=True)
        rows.append(
            {
                "name": name,
                "env": (field.alias or f"{prefix}{name}").upper(),
                "value": shown,
                "secret": secret,
                "is_set": value not in (None, "", [], {}),
                "default": value == default,
                "description": field.description or "",
            }
        )
    return rows
