"""`/admin/api/access…`: who may talk to the bot — pairing codes and stored allowlists.

Same authentication as the rest of `/admin/api`. Changes take effect with the next message
on every replica (nothing is cached). The dashboard's page for them is `app.web.access_page`.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import BaseModel, ConfigDict, Field

from app.access import AccessGate, BadAccessInput, QuotaLimits, access_mode
from app.api.deps import get_runtime, require_admin
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api/access", tags=["access"], dependencies=[Depends(require_admin)])

Kind = Literal["sender", "chat"]


class Entry(BaseModel):
    """A sender (or a group chat: everyone in it) allowed on a channel."""

    model_config = ConfigDict(extra="forbid")

    channel: str = Field(min_length=1, max_length=64)
    kind: Kind = "sender"
    id: str = Field(min_length=1, max_length=256, description="The sender's or chat's platform id.")
    note: str | None = Field(None, max_length=200)


class Approval(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str = Field(min_length=1, max_length=32)


def _gate(runtime: Runtime) -> AccessGate:
    return runtime.access


def _known(channel: str) -> None:
    from channels import KNOWN_CHANNELS

    if channel not in KNOWN_CHANNELS:
        raise HTTPException(400, f"unknown channel {channel!r}")


@router.get("")
async def access_overview(runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Each channel's mode, static lists and quotas; the stored entries; pending pairing codes."""
    store = _gate(runtime).store
    channels = {
        name: {
            "access": access_mode(cs),
            "allowed_senders": cs.allowed_senders,
            "allowed_chats": cs.allowed_chats,
            "answer_unknown_dm": cs.answer_unknown_dm,
            "quotas": asdict(QuotaLimits.of(cs)),
        }
        for name, cs in sorted(runtime.channel_settings.items())
    }
    return {"channels": channels, "entries": await store.entries(), "pending": await store.pending()}


@router.get("/entries")
async def list_entries(
    channel: str | None = Query(None, max_length=64), runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """The stored allowlist entries (the static settings come on top of these)."""
    try:
        return {"entries": await _gate(runtime).store.entries(channel)}
    except BadAccessInput as exc:
        raise HTTPException(400, str(exc)) from exc


@router.post("/entries", status_code=201)
async def add_entry(entry: Entry, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Allow a sender, or everyone in a group chat; `added` is false when it was already."""
    _known(entry.channel)
    try:
        added = await _gate(runtime).store.add(
            entry.channel, entry.kind, entry.id, note=entry.note, added_by="admin"
        )
    except BadAccessInput as exc:
        raise HTTPException(400, str(exc)) from exc
    return {"added": added, **entry.model_dump(exclude={"note"})}


@router.delete("/entries")
async def remove_entry(
    channel: str = Query(min_length=1, max_length=64),
    id: str = Query(min_length=1, max_length=256),
    kind: Kind = "sender",
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Take a sender or chat off the stored list; 404 when it is not on it."""
    try:
        removed = await _gate(runtime).store.remove(channel, kind, id)
    except BadAccessInput as exc:
        raise HTTPException(400, str(exc)) from exc
    if not removed:
        raise HTTPException(404, f"{kind} {id!r} is not on the stored list of {channel}")
    return {"removed": True, "channel": channel, "kind": kind, "id": id}


@router.get("/pending")
async def pending_codes(
    channel: str | None = Query(None, max_length=64), runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Pairing requests waiting for approval, oldest first."""
    try:
        return {"pending": await _gate(runtime).store.pending(channel)}
    except BadAccessInput as exc:
        raise HTTPException(400, str(exc)) from exc


@router.post("/approve")
async def approve_code(approval: Approval, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Approve a pairing code: its sender may talk from now on. 404 when the code is not
    pending (expired, used already, or unknown)."""
    approved = await _gate(runtime).store.approve(approval.code, by="admin")
    if approved is None:
        raise HTTPException(404, "no pending pairing code like that (expired, used, or unknown)")
    return {"approved": {"channel": approved.channel, "sender_id": approved.sender_id}}
