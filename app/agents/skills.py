"""Skills: folders with a `SKILL.md`, loaded into one session's context only.

`SKILL.md` starts with front matter (`name`, `description`) and its body is the
instructions::

    ---
    name: haiku
    description: Answer in haiku.
    ---
    Answer every question as a haiku of 5-7-5 syllables.

Skills are found in the global folder (`SKILLS_DIR`, one sub-folder per skill) and in the
serving agent's folder (its `skills_dir`); an agent's skill wins over a global one of the
same name. The model sees the names and descriptions of the available skills and loads one
with the `load_skill` tool; people use `/skill NAME`, `/skill -NAME` and `/skills`. What is
loaded is recorded on the session (`sessions.metadata.skills`), and the instructions of the
loaded skills join that session's system text only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import yaml
from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from app.agent.provider import ToolSpec
from app.agent.tools import Risk, ToolContext, ToolError
from app.agents.profiles import AgentBook
from app.channel import AgentListing
from app.db.models import sessions, utcnow
from app.events import agent_in_key

log = structlog.get_logger(__name__)

SKILLS = "skills"  # the session metadata entry: names of the loaded skills
MAX_INSTRUCTIONS = 8000


@dataclass(frozen=True)
class Skill:
    name: str
    description: str
    instructions: str
    folder: Path


def read_skill(folder: Path) -> Skill | None:
    """The skill in `folder`, or None (logged) when its SKILL.md is missing or malformed."""
    path = folder / "SKILL.md"
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---"):
        log.warning("skill_without_front_matter", path=str(path))
        return None
    _, front, body = text.split("---", 2)
    meta: Any = yaml.safe_load(front) or {}
    name = str(meta.get("name") or "").strip() if isinstance(meta, dict) else ""
    if not name:
        log.warning("skill_without_name", path=str(path))
        return None
    description = " ".join(str(meta.get("description") or "").split())
    return Skill(name, description, body.strip()[:MAX_INSTRUCTIONS], folder)


def read_folder(root: str | None) -> dict[str, Skill]:
    if not root or not Path(root).is_dir():
        return {}
    found: dict[str, Skill] = {}
    for folder in sorted(Path(root).iterdir()):
        skill = read_skill(folder) if folder.is_dir() else None
        if skill is not None:
            found[skill.name] = skill
    return found


async def loaded_skills(conn: AsyncConnection, session_id: int) -> list[str]:
    metadata = (await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session_id))).scalar()
    names = (metadata or {}).get(SKILLS) or []
    return [str(n) for n in names]


async def set_loaded(conn: AsyncConnection, session_id: int, names: list[str]) -> dict[str, Any]:
    """Record the loaded skills on the session row (read-modify-write); the new metadata."""
    metadata = (
        await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session_id))
    ).scalar() or {}
    metadata = {**metadata, SKILLS: names}
    await conn.execute(
        update(sessions).where(sessions.c.id == session_id).values(metadata=metadata, updated_at=utcnow())
    )
    return metadata


class SkillLibrary:
    def __init__(self, global_dir: str | None, book: AgentBook, engine: AsyncEngine) -> None:
        self.engine = engine
        self.global_skills = read_folder(global_dir)
        self.agent_skills = {name: read_folder(a.skills_dir) for name, a in book.agents.items()}
        self.book = book

    def available(self, session_key: str) -> dict[str, Skill]:
        """The agent's own skills, and the global ones its `skills` list names (all: empty)."""
        agent = self.book.get(agent_in_key(session_key))
        wanted = set(agent.skills)
        shared = {n: s for n, s in self.global_skills.items() if not wanted or n in wanted}
        return {**shared, **self.agent_skills.get(agent.name, {})}

    def listing(self) -> list[AgentListing]:
        """Every agent with the skills it may load (what A2A's per-agent cards show)."""
        listed = []
        for name, agent in self.book.agents.items():
            skills = {**self.global_skills, **self.agent_skills.get(name, {})}
            if agent.skills:  # the agent's own list, where it has one
                skills = {n: s for n, s in skills.items() if n in agent.skills}
            pairs = tuple((s.name, s.description) for s in skills.values())
            listed.append(
                AgentListing(
                    name,
                    agent.description,
                    pairs,
                    default=name == self.book.default,
                    users=tuple(agent.users),
                )
            )
        return listed

    @property
    def any(self) -> bool:
        return bool(self.global_skills) or any(self.agent_skills.values())

    async def context(self, ctx: ToolContext) -> str | None:
        """Context source of the run: the list of skills, and the loaded ones' instructions."""
        available = self.available(ctx.session_key)
        if not available:
            return None
        async with self.engine.connect() as conn:
            loaded = [n for n in await loaded_skills(conn, ctx.session_id) if n in available]
        lines = ["Skills you can load with the load_skill tool:"]
        lines += [f"- {s.name}: {s.description}" for s in available.values()]
        for name in loaded:
            lines.append(f"\n## Skill loaded in this conversation: {name}\n{available[name].instructions}")
        return "\n".join(lines)


class LoadSkillTool:
    spec = ToolSpec(
        name="load_skill",
        description="Load one of the listed skills into this conversation; returns its instructions.",
        parameters={
            "type": "object",
            "properties": {"name": {"type": "string", "description": "The skill's name."}},
            "required": ["name"],
            "additionalProperties": False,
        },
    )
    risk = Risk.SAFE

    def __init__(self, library: SkillLibrary) -> None:
        self.library = library

    async def run(self, arguments: dict[str, Any], ctx: ToolContext) -> str:
        name = str(arguments.get("name") or "").strip()
        available = self.library.available(ctx.session_key)
        skill = available.get(name)
        if skill is None:
            raise ToolError(f"no skill named {name!r}; available: {', '.join(available) or 'none'}")
        # The turn holds the key's lease: nothing else writes this session meanwhile.
        async with self.library.engine.begin() as conn:
            loaded = await loaded_skills(conn, ctx.session_id)
            if name not in loaded:
                await set_loaded(conn, ctx.session_id, [*loaded, name])
        return f"Skill {name} loaded. Its instructions:\n{skill.instructions}"
