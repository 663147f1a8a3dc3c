"""Admin REST API for people's data on request (bearer ADMIN_TOKEN): export one person or
one session as JSON, erase one person everywhere with a receipt (`app.data_rights`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query
from pydantic import ConfigDict, Field, StrictBool, model_validator

from app.api.bodies import RequestBody
from app.api.deps import get_runtime, require_admin
from app.api.routes import keypath as _keypath  # noqa: F401  (registers {key:key})
from app.data_rights import Person, UnknownPerson, erase, export, export_session, find_person
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api", tags=["admin: people's data"], dependencies=[Depends(require_admin)])


async def _person(runtime: Runtime, identity: str | None, person: str | None) -> Person:
    try:
        return await find_person(runtime.engine, identity=identity, person=person)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc
    except UnknownPerson as exc:
        raise HTTPException(404, str(exc)) from exc


@router.get("/people/export")
async def export_person(
    identity: str | None = Query(None, max_length=600, description="`channel:sender_id`, e.g. telegram:42"),
    person: str | None = Query(None, max_length=200, description="A person id: all its linked identities."),
    runtime: Runtime = Depends(get_runtime),
) -> dict[str, Any]:
    """Everything stored about one person: direct conversations, their messages in groups,
    events, memory, identity links and usage."""
    return await export(runtime.engine, await _person(runtime, identity, person))


class EraseRequest(RequestBody):
    model_config = ConfigDict(extra="forbid")

    identity: str | None = Field(None, max_length=600, description="`channel:sender_id`")
    person: str | None = Field(None, max_length=200, description="A person id")
    confirm: StrictBool = Field(description="Must be true: erasure cannot be undone.")

    @model_validator(mode="after")
    def _one(self) -> EraseRequest:
        if (self.identity is None) == (self.person is None):
            raise ValueError("give `identity` or `person`, not both")
        if not self.confirm:
            raise ValueError("`confirm` must be true: erasure cannot be undone")
        return self


@router.post("/people/erase")
async def erase_person(body: EraseRequest, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Erase one person everywhere; the receipt counts what was removed, per kind. Other
    people's messages in shared groups stay; erased messages become tombstones."""
    who = await _person(runtime, body.identity, body.person)
    receipt = await erase(runtime.engine, who, runtime.settings.workspace_root)
    return {"erased": [f"{c}:{s}" for c, s in who.identities], "receipt": receipt}


@router.get("/session-exports/{key:key}")
async def export_one_session(key: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """One session key as JSON: every generation with its messages and run traces."""
    try:
        return await export_session(runtime.engine, key)
    except UnknownPerson as exc:
        raise HTTPException(404, str(exc)) from exc
