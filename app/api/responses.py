"""Responses and error handlers every route shares."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from sqlalchemy.exc import DataError, StatementError


class SafeJSONResponse(JSONResponse):
    """JSON that always serialises: a stored string with no UTF-8 form (a lone surrogate
    kept from before chatgate refused them) is sent as a `\\udXXX` escape, not a 500."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, allow_nan=False, separators=(",", ":")).encode()


def _bad(detail: str) -> JSONResponse:
    return SafeJSONResponse({"detail": detail}, status_code=400)


async def validation_error(_request: Request, exc: Exception) -> JSONResponse:
    """A model built from request input refused it (e.g. `InboundEvent` and a NUL)."""
    assert isinstance(exc, ValidationError)
    problems = "; ".join(e["msg"] for e in exc.errors()[:5])
    return _bad(f"invalid input: {problems}")


async def unstorable_value(_request: Request, exc: Exception) -> JSONResponse:
    """The database (or its driver) refused a value from the request: nothing was stored."""
    if isinstance(exc, StatementError) and not isinstance(exc, DataError):
        if not isinstance(exc.orig, (UnicodeError, ValueError, OverflowError)):
            raise exc
    return _bad(f"a value cannot be stored: {type(getattr(exc, 'orig', exc)).__name__}")


def install(app: Any) -> None:
    app.add_exception_handler(ValidationError, validation_error)
    app.add_exception_handler(StatementError, unstorable_value)
    app.add_exception_handler(UnicodeEncodeError, unstorable_value)
    app.add_exception_handler(OverflowError, unstorable_value)
