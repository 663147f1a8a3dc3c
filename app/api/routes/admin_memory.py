"""Admin REST API for memory identities: link channel identities to one person (bearer ADMIN_TOKEN).

Identities are written as the platform sends them, `channel:sender_id` (everything
after the first colon is the sender id), like `python -m app.memory link`; in a path
they are percent-encoded (`telegram%3A42`). Listings also carry `identity`, the escaped
form that names the owner of memory.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from app.api.deps import get_runtime, require_admin
from app.api.routes import keypath as _keypath  # noqa: F401  (registers {key:key})
from app.memory.identity import IdentityLink, IdentityLinks, check_person_id, parse_identity
from app.runtime import Runtime

router = APIRouter(prefix="/admin/api", tags=["admin"], dependencies=[Depends(require_admin)])


class LinkRequest(BaseModel):  # `_identity` and `_person` check its text
    model_config = ConfigDict(extra="forbid")

    identity: str = Field(
        description="`channel:sender_id` as the platform sends it", examples=["telegram:42"]
    )
    person_id: str = Field(description="1-200 characters of A-Z a-z 0-9 _ . @ -", examples=["alice"])


def _links(runtime: Runtime) -> IdentityLinks:
    return IdentityLinks(runtime.engine)


def _identity(text: str) -> str:
    try:
        return parse_identity(text)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


def _person(person_id: str) -> str:
    try:
        return check_person_id(person_id)
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from None


def _out(link: IdentityLink) -> dict[str, Any]:
    return {
        "identity": link.identity,
        "channel": link.channel,
        "sender_id": link.sender_id,
        "person_id": link.person_id,
        "created_at": link.created_at,
        "created_by": link.created_by,
    }


@router.get("/identity-links")
async def list_identity_links(
    person_id: str | None = None, runtime: Runtime = Depends(get_runtime)
) -> dict[str, Any]:
    """Identity links, by person then identity; only one person's with `person_id`."""
    if person_id is not None:
        _person(person_id)
    return {"links": [_out(link) for link in await _links(runtime).links(person_id)]}


@router.post("/identity-links")
async def link_identity(body: LinkRequest, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Link an identity to a person: its user memory moves to the person and is shared with
    the person's other identities. Re-linking to another person moves the link only."""
    identity = _identity(body.identity)
    person_id = _person(body.person_id)
    links = _links(runtime)
    previous = await links.link(identity, person_id, created_by="admin-api")
    [link] = await links.links(identity=identity)
    return {**_out(link), "previous_person_id": previous}


@router.get("/identity-links/{identity:key}")
async def get_identity_link(identity: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """The person an identity is linked to (404 when it is not linked)."""
    found = await _links(runtime).links(identity=_identity(identity))
    if not found:
        raise HTTPException(404, f"{identity!r} is not linked to a person")
    return _out(found[0])


@router.delete("/identity-links/{identity:key}")
async def unlink_identity(identity: str, runtime: Runtime = Depends(get_runtime)) -> dict[str, Any]:
    """Remove an identity's link; memory stays with the person, the identity starts empty."""
    escaped = _identity(identity)
    if not await _links(runtime).unlink(escaped):
        raise HTTPException(404, f"{identity!r} is not linked to a person")
    return {"identity": escaped, "unlinked": True}
