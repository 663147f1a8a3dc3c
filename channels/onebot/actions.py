"""OneBot v11 API calls: answers as typed delivery errors, replies cut into messages."""

from __future__ import annotations

from typing import Any

import httpx

from app.errors import ChannelRejected, ChannelSendAuthError, ChannelUnavailable, DeliveryError
from channels.onebot.message import Segment, split_text


def action_result(action: str, response: Any) -> Any:
    """The `data` of an OK response; a typed `DeliveryError` otherwise."""
    if not isinstance(response, dict):
        raise ChannelUnavailable(f"{action}: malformed response")
    status, retcode = response.get("status"), response.get("retcode")
    if status in ("ok", "async") or retcode in (0, 1):
        return response.get("data")
    detail = f"{action} failed: retcode {retcode} {response.get('wording') or response.get('msg') or ''}"
    error: DeliveryError
    if retcode in (1401, 1403):
        error = ChannelSendAuthError(detail.strip())
    elif retcode in (100, 1400, 1404):  # bad parameters, unknown action: retrying will not help
        error = ChannelRejected(detail.strip())
    else:  # bridge-side failures (network to QQ, risk control, timeouts): retry, bounded
        error = ChannelUnavailable(detail.strip())
    raise error


def batches(segments: list[Segment], limit: int) -> list[list[Segment]]:
    """Group segments into messages whose text stays within `limit` characters."""
    batches: list[list[Segment]] = [[]]
    size = 0
    for seg in segments:
        if seg["type"] != "text":
            batches[-1].append(seg)
            continue
        for piece in split_text(seg["data"]["text"], limit):
            if size + len(piece) > limit and batches[-1]:
                batches.append([])
                size = 0
            batches[-1].append({"type": "text", "data": {"text": piece}})
            size += len(piece)
    return [b for b in batches if b]


def id_param(value: str) -> int | str:
    """QQ ids are numbers on the wire; WeChat bridges use strings (wxid_…)."""
    return int(value) if value.isdigit() else value


def retry_after(resp: httpx.Response) -> float:
    try:
        return max(0.0, float(resp.headers.get("retry-after", "1")))
    except ValueError:
        return 1.0
