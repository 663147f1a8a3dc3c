"""Checks of raw JSON-RPC parameters the SDK's parsing lets through.

The SDK reads enums leniently: an unknown `status` of `ListTasks` becomes "unspecified"
(no filter), so a typo would list every task. The specification wants `-32602` for it.
"""

from __future__ import annotations

import json
from typing import Any

from a2a.types.a2a_pb2 import TaskState
from starlette.responses import JSONResponse

_LIST_METHODS = ("ListTasks", "tasks/list")


def check_params(body: bytes) -> JSONResponse | None:
    """A -32602 answer for a parameter the SDK would misread, else None."""
    try:
        request = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    if not isinstance(request, dict) or request.get("method") not in _LIST_METHODS:
        return None
    params = request.get("params")
    if not isinstance(params, dict) or "status" not in params:
        return None
    status = params["status"]
    if isinstance(status, str) and status in TaskState.keys():
        return None
    if isinstance(status, int) and not isinstance(status, bool) and status in TaskState.values():
        return None
    return _invalid(request.get("id"), f"status must be one of {', '.join(TaskState.keys()[1:])}")


def _invalid(rpc_id: Any, message: str) -> JSONResponse:
    if not isinstance(rpc_id, (str, int)) or isinstance(rpc_id, bool):
        rpc_id = None
    error = {"code": -32602, "message": message}
    return JSONResponse({"jsonrpc": "2.0", "id": rpc_id, "error": error})
