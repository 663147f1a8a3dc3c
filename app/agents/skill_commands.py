"""/skills and /skill: which skills a session may load, and loading or unloading one.

The loaded skills are recorded on the session row (`app.agents.skills.SKILLS`), read
fresh each time: the `load_skill` tool may have written them during a turn.
"""

from __future__ import annotations

from typing import Any

from app.agents.skills import SKILLS, SkillLibrary
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say


def loaded_of(metadata: dict[str, Any]) -> list[str]:
    return [str(n) for n in metadata.get(SKILLS) or []]


class SkillCommands:
    def __init__(self, store: PipelineStore, replies: Replies, skills: SkillLibrary) -> None:
        self.store = store
        self.replies = replies
        self.skills = skills

    def commands(self) -> list[Command]:
        return [
            Command(
                "/skills",
                {"en": "List the skills and which are loaded.", "zh": "列出技能及已加载的技能。"},
                self.list_skills,
            ),
            Command(
                "/skill",
                {"en": "Load a skill here (-NAME unloads it).", "zh": "在此对话加载技能（-名称 卸载）。"},
                self.skill,
                usage="[-]NAME",
            ),
        ]

    async def list_skills(self, call: CommandCall) -> None:
        available = self.skills.available(call.lease.key)
        opened = await self.store.open_session(call.lease, conversation_channel(call.event))
        loaded = loaded_of(opened.metadata)
        lines = [say("skills.title", call.locale)]
        for skill in available.values():
            mark = " *" if skill.name in loaded else ""
            lines.append(f"- {skill.name}: {skill.description}{mark}")
        if not available:
            lines.append(say("none", call.locale))
        await self.replies.answer(call.lease, call.row, "\n".join(lines), session_id=opened.session.id)

    async def skill(self, call: CommandCall) -> None:
        arg = call.args.strip()
        unload = arg.startswith("-")
        name = arg.lstrip("-").strip()
        available = self.skills.available(call.lease.key)
        if not name or (not unload and name not in available):
            listed = ", ".join(available) or say("none", call.locale)
            text = say("skill.unknown", call.locale, skill=name or "?", skills=listed)
            await self.replies.answer(call.lease, call.row, text)
            return
        channel = conversation_channel(call.event)
        # Under the key's lease nothing else writes the session meanwhile: read, then write.
        loaded = loaded_of((await self.store.open_session(call.lease, channel)).metadata)
        if unload:
            key = "skill.unloaded" if name in loaded else "skill.not_loaded"
            names = [n for n in loaded if n != name]
        else:
            key = "skill.loaded"
            names = loaded if name in loaded else [*loaded, name]
        answer = self.replies.answer_of(call.row, say(key, call.locale, skill=name))
        await self.store.set_session_metadata(call.lease, channel, {SKILLS: names}, answer=answer)
        self.replies.handled([call.row.event_id])
