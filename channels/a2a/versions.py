"""A2A version negotiation for the JSON-RPC endpoint.

The specification: a request names its protocol version in `A2A-Version`; one the agent
does not speak gets `VersionNotSupportedError` (-32009). The SDK reads a request without
the header as 0.3, which refuses a 1.0 method (`SendMessage`) sent without it; here the
method's own naming decides then (`message/send` is 0.3, `SendMessage` is 1.0). With
the header (or the `A2A-Version` query parameter), a version other than 0.3 or 1.x, or a
0.3 method under 1.0, is -32009.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs

from starlette.responses import JSONResponse
from starlette.types import Scope

_VERSION_HEADER = b"a2a-version"
_SUPPORTED = ("0.3", "1.0")


def _spoken(raw: str) -> str | None:
    """The version this server speaks for a header value (`1`, `1.0`, `1.0.2` → 1.0)."""
    parts = raw.strip().split(".")
    if not all(p.isdigit() for p in parts) or not parts[0]:
        return None
    major, minor = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    if major == 1:
        return "1.0"
    if (major, minor) == (0, 3):
        return "0.3"
    return None


def negotiate_version(scope: Scope, body: bytes) -> tuple[Scope, JSONResponse | None]:
    """The scope to serve (its version header set as the SDK reads it), or a -32009 answer."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return scope, None  # the SDK answers a parse error
    if not isinstance(request, dict) or not isinstance(request.get("method"), str):
        return scope, None
    method, rpc_id = request["method"], request.get("id")
    old_style = "/" in method
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != _VERSION_HEADER]
    given = next((v.decode("latin-1") for k, v in scope["headers"] if k.lower() == _VERSION_HEADER), "")
    if not given.strip():  # a client may name the version as a request parameter instead
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = next((values[0] for name, values in query.items() if name.lower() == "a2a-version"), "")
    if not given.strip():
        version = "0.3" if old_style else "1.0"
    else:
        spoken = _spoken(given)
        if spoken is None or (spoken == "1.0" and old_style):
            why = (
                f"A2A version {given.strip()[:20]!r} is not supported here"
                if spoken is None
                else f"{method} is an A2A 0.3 method; under A2A-Version 1.0 use its 1.0 name"
            )
            return scope, _version_error(rpc_id, why)
        version = spoken
    headers.append((_VERSION_HEADER, version.encode()))
    return {**scope, "headers": headers}, None


def _version_error(rpc_id: Any, message: str) -> JSONResponse:
    error = {
        "code": -32009,
        "message": message,
        "data": [
            {
                "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "VERSION_NOT_SUPPORTED",
                "domain": "a2a-protocol.org",
                "metadata": {"supportedVersions": ",".join(_SUPPORTED)},
            }
        ],
    }
    if not isinstance(rpc_id, (str, int)) or isinstance(rpc_id, bool):
        rpc_id = None
    return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})
