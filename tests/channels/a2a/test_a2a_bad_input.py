"""A2A input no store can hold, or nested absurdly deep, is a JSON-RPC error with a generic
message (`-32602` / `-32600`), never `-32603` with a Python message; nothing is stored."""

from __future__ import annotations

import json

import httpx
import pytest

from app.db.models import inbox
from tests.channels.a2a.test_a2a import TOKEN_A, channels
from tests.channels.support import count
from tests.conftest import ServeApp

HEADERS = {"Authorization": f"Bearer {TOKEN_A}", "Content-Type": "application/json", "A2A-Version": "1.0"}


def _send(text_json: str, request_id: int = 7) -> bytes:
    """A SendMessage request whose text is `text_json` (already JSON: escapes stay as written)."""
    message = (
        '{"messageId": "m1", "contextId": "c", "role": "ROLE_USER", "parts": [{"text": ' + text_json + "}]}"
    )
    return (
        f'{{"jsonrpc": "2.0", "id": {request_id}, "method": "SendMessage", '
        f'"params": {{"message": {message}}}}}'
    ).encode()


def _deep(levels: int) -> bytes:
    return (
        '{"jsonrpc": "2.0", "id": 9, "method": "SendMessage", "params": {"metadata": %s}}'
        % ("[" * levels + "]" * levels)
    ).encode()


@pytest.mark.parametrize(
    ("body", "code", "request_id"),
    [
        (_send('"nul \\u0000 here"'), -32602, 7),
        (_send('"lone \\ud800 surrogate"'), -32602, 7),
        (_send('"ok"', 8).replace(b'"m1"', b'"m\\udfff1"'), -32602, 8),
        (_deep(200), -32600, 9),
        (_deep(100_000), -32600, None),  # too deep even to parse: no id can be read
    ],
)
async def test_bad_input_is_a_generic_jsonrpc_error(
    serve: ServeApp, body: bytes, code: int, request_id: int | None
) -> None:
    async with serve(channel_settings=channels()) as srv, httpx.AsyncClient(timeout=30) as http:
        resp = await http.post(f"{srv.url}/a2a", content=body, headers=HEADERS)
        assert resp.status_code == 200, resp.text
        answer = resp.json()
        assert answer["error"]["code"] == code
        assert answer["id"] == request_id
        message = answer["error"]["message"]
        assert "Error" not in message and "Traceback" not in message and "\\u" not in message
        assert await count(srv.runtime, inbox) == 0
        # The same request with clean text is served.
        fine = await http.post(f"{srv.url}/a2a", content=_send('"hello"'), headers=HEADERS)
        assert "error" not in fine.json(), fine.text
        assert json.loads(fine.text)["id"] == 7
