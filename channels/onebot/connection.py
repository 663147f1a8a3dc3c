"""One bridge connected to us over reverse WebSocket, and the calls we make on it.

API calls are `{"action", "params", "echo"}` frames; the bridge answers on the same
socket with `{"status", "retcode", "data", "echo"}`. Each call waits for its own echo
with a timeout, so a silent or vanished bridge becomes a retryable `ChannelUnavailable`.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from app.channel import ChannelWebSocket
from app.errors import ChannelUnavailable


class BotConnection:
    def __init__(self, self_id: str, ws: ChannelWebSocket, role: str) -> None:
        self.self_id = self_id
        self.ws = ws
        self.role = role
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._send_lock = asyncio.Lock()
        self.closed = False

    @property
    def serves_api(self) -> bool:
        return self.role in ("universal", "api")

    async def call(self, action: str, params: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one action and wait for the response carrying our echo."""
        if self.closed:
            raise ChannelUnavailable(f"bot {self.self_id} disconnected")
        echo = uuid.uuid4().hex
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[echo] = future
        frame = json.dumps({"action": action, "params": params, "echo": echo}, ensure_ascii=False)
        try:
            async with self._send_lock:
                await self.ws.send_text(frame)
            return await asyncio.wait_for(future, timeout)
        except TimeoutError as exc:
            detail = f"bot {self.self_id} did not answer {action} within {timeout} s"
            raise ChannelUnavailable(detail) from exc
        except ChannelUnavailable:
            raise
        except Exception as exc:  # the socket broke under us
            raise ChannelUnavailable(f"bot {self.self_id}: {type(exc).__name__}: {exc}") from exc
        finally:
            self._pending.pop(echo, None)

    def resolve(self, response: dict[str, Any]) -> bool:
        """Hand a response frame to the call waiting for its echo; False if nobody waits."""
        future = self._pending.get(str(response.get("echo")))
        if future is None or future.done():
            return False
        future.set_result(response)
        return True

    def fail_pending(self, reason: str) -> None:
        self.closed = True
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ChannelUnavailable(f"bot {self.self_id}: {reason}"))
