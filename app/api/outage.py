"""Database outages as answers: 503, a JSON body and `Retry-After`, on every route.

While the database cannot be reached (`app.db.outage.unreachable`), a platform webhook,
the generic webhook, the admin API and the gateway answer

    503 {"error": "database_unavailable", "detail": …}   Retry-After: DB_OUTAGE_RETRY_AFTER_SECONDS

instead of a plain-text 500 and a traceback per request (a WebSocket not yet accepted
gets the same 503 where the server supports denial responses, else close code 1013,
"try again later"). Nothing was acknowledged, so a sender retries with the same id (the
same `Idempotency-Key`, `message_id`, update id): an event that was in fact stored is
answered as a duplicate, never handled twice. Any other error keeps its answer.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from app.db.outage import Outage, unreachable

DETAIL = "the database cannot be reached right now; retry later with the same id"
TRY_AGAIN_LATER = 1013  # WebSocket close code: "Try Again Later"


def response(outage: Outage) -> JSONResponse:
    return JSONResponse(
        {"error": "database_unavailable", "detail": DETAIL},
        status_code=503,
        headers={"Retry-After": str(outage.retry_after)},
    )


def answer(outage: Outage, exc: BaseException) -> JSONResponse | None:
    """The 503 for `exc` if it says the database is away (counted), else None."""
    if not unreachable(exc):
        return None
    outage.refused(exc)
    return response(outage)


async def send_refusal(found: JSONResponse, scope: Scope, receive: Receive, send: Send) -> None:
    """Send the 503 `found` for a request whose answer had not started (`app.api.door.Door`):
    as the HTTP answer, as a WebSocket denial response where the server supports one, else
    as close code 1013."""
    if scope["type"] == "http":
        await found(scope, receive, send)
    elif "websocket.http.response" in scope.get("extensions", {}):
        await send({"type": "websocket.http.response.start", "status": 503, "headers": found.raw_headers})
        await send({"type": "websocket.http.response.body", "body": found.body})
    else:
        close = {"type": "websocket.close", "code": TRY_AGAIN_LATER, "reason": "database_unavailable"}
        await send(close)
