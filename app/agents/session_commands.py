"""The commands people use to steer their own session: /status /whoami /title /model
/sessions /resume. Each is one registry entry (`SessionCommands.commands`) and a handler.

What a command changes is stored on the session row (`title`, `metadata["model"]`), under
the key's lease like every write, so it survives a restart and a new generation starts
clean (`/new` forgets the chosen model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import func, select, update

from app.agents.profiles import DEFAULT_AGENT, AgentProfile, AgentRouter
from app.agents.senders import SessionSenders, elsewhere_lines
from app.agents.skills import SKILLS, SkillLibrary, loaded_skills, set_loaded
from app.db.models import approvals, sessions, utcnow
from app.events import InboundEvent
from app.memory.consolidation import Consolidator
from app.memory.generations import next_generation
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say
from app.pipeline.turn import TurnRunner
from app.pipeline.turn_state import Handled
from app.sessions.history_marks import last_turn, mark, visible
from app.sessions.messages import ChatMessage
from app.sessions.store import SessionState

TITLE_MAX = 200
SESSIONS_LISTED = 10


def estimate_tokens(texts: Sequence[str]) -> int:
    """A rough token count (about four characters a token), for /status."""
    return sum((len(t) + 3) // 4 for t in texts)


class SessionCommands:
    def __init__(
        self,
        store: PipelineStore,
        replies: Replies,
        *,
        channel_models: Mapping[str, str | None],
        default_model: str,
        allowed_models: Sequence[str] = (),
        window_limit: int = 100,
        turns: TurnRunner | None = None,
        consolidator: Consolidator | None = None,
        agents: AgentRouter | None = None,
        skills: SkillLibrary | None = None,
    ) -> None:
        self.agents = agents
        self.skills = skills
        self.store = store
        self.turns = turns  # /retry runs a turn
        self.consolidator = consolidator  # /compact folds with it
        self.replies = replies
        self.channel_models = dict(channel_models)
        self.default_model = default_model
        self.allowed_models = list(allowed_models)
        self.window_limit = window_limit
        self.senders: SessionSenders | None = None  # set by the runtime (/sessions across chats)

    def commands(self) -> list[Command]:
        return [
            Command(
                "/status",
                {"en": "Show this conversation's state.", "zh": "查看当前对话的状态。"},
                self.status,
            ),
            Command(
                "/whoami",
                {"en": "Show who you are to the bot.", "zh": "查看你在机器人这里的身份。"},
                self.whoami,
            ),
            Command(
                "/title",
                {"en": "Show or set this conversation's title.", "zh": "查看或设置当前对话的标题。"},
                self.title,
                usage="[TEXT]",
            ),
            Command(
                "/model",
                {"en": "Show or choose this conversation's model.", "zh": "查看或选择当前对话的模型。"},
                self.model,
                usage="[NAME]",
            ),
            Command(
                "/sessions",
                {"en": "List the conversations in this chat.", "zh": "列出此聊天中的对话。"},
                self.sessions,
            ),
            Command(
                "/resume",
                {"en": "Continue an earlier conversation.", "zh": "继续之前的某个对话。"},
                self.resume,
                usage="<N>",
            ),
        ]

    def agent_commands(self) -> list[Command]:
        """/agent (it needs the agents)."""
        return [
            Command(
                "/agent",
                {
                    "en": "List the agents, or switch this chat to one.",
                    "zh": "列出智能体，或将此聊天切换到某个智能体。",
                },
                self.agent_command,
                usage="[NAME]",
            )
        ]

    def skill_commands(self) -> list[Command]:
        """/skills and /skill (they need the skill library)."""
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

    def history_commands(self) -> list[Command]:
        """/undo and /retry (they need the turn runner)."""
        return [
            Command(
                "/undo",
                {
                    "en": "Take back the last exchange (it stays in the history, the bot forgets it).",
                    "zh": "撤回上一轮对话（历史中保留，但机器人不再参考）。",
                },
                self.undo,
            ),
            Command(
                "/retry",
                {
                    "en": "Answer your last message again (the old answer is kept, marked superseded).",
                    "zh": "重新回答你的上一条消息（旧回答保留并标记为已取代）。",
                },
                self.retry,
            ),
            Command(
                "/compact",
                {
                    "en": "Summarize this conversation and continue in a fresh one that keeps the summary.",
                    "zh": "总结当前对话，并在保留摘要的新对话中继续。",
                },
                self.compact,
            ),
        ]

    # --- helpers ------------------------------------------------------------------------

    def agent(self, event: InboundEvent) -> AgentProfile:
        return self.agents.agent_of(event) if self.agents is not None else AgentProfile(DEFAULT_AGENT)

    def base_model(self, event: InboundEvent) -> str:
        """The model before /model: the agent's, else the channel's, else the service's."""
        return self.agent(event).model or self.channel_models.get(event.channel) or self.default_model

    def models_for(self, event: InboundEvent) -> list[str]:
        """The models /model may choose: the base model first, then the agent's (else LLM_MODELS)."""
        default = self.base_model(event)
        more = self.agent(event).models or self.allowed_models
        return [default, *(m for m in more if m != default)]

    def session_model(self, session: SessionState, event: InboundEvent) -> str:
        chosen = session.metadata.get("model")
        return chosen if isinstance(chosen, str) and chosen else self.base_model(event)

    async def _reply(self, call: CommandCall, text: str, session_id: int | None) -> None:
        async with self.store.fenced(call.lease) as conn:
            await self.replies.answer(conn, call.row, text, session_id=session_id)
        self.replies.handled([call.row.event_id])

    async def _set(self, call: CommandCall, text_of: Any, **values: Any) -> None:
        """Write `values` on the key's open session and answer `text_of(session)` in one transaction."""
        lease, sessions_ = call.lease, self.store.sessions
        async with self.store.fenced(lease) as conn:
            session = await sessions_.open_current(
                conn, lease.key, conversation_channel(call.event), fence=lease.fence
            )
            row_values: dict[str, Any] = {"updated_at": utcnow()}
            state = session
            if "title" in values:
                row_values["title"] = values["title"]
            if "metadata" in values:
                # Read fresh: a tool (load_skill) may have written it during a turn.
                fresh = (
                    await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session.id))
                ).scalar() or {}
                change = values["metadata"]
                metadata = change(fresh) if callable(change) else {**fresh, **change}
                row_values["metadata"] = metadata
                state = replace(session, metadata=metadata)
            await conn.execute(update(sessions).where(sessions.c.id == session.id).values(**row_values))
            sessions_.remember(lease.key, state, fence=lease.fence)
            await self.replies.answer(conn, call.row, text_of(state), session_id=session.id)
        self.replies.handled([call.row.event_id])

    async def _open(self, call: CommandCall) -> tuple[SessionState, dict[str, Any]]:
        """The key's open session (opened if none) and its row's title."""
        lease = call.lease
        async with self.store.fenced(lease) as conn:
            session = await self.store.sessions.open_current(
                conn, lease.key, conversation_channel(call.event), fence=lease.fence
            )
            row = (
                (await conn.execute(select(sessions.c.title).where(sessions.c.id == session.id)))
                .mappings()
                .one()
            )
            pending = (
                await conn.execute(
                    select(func.count())
                    .select_from(approvals)
                    .where(approvals.c.session_id == session.id, approvals.c.status == "pending")
                )
            ).scalar_one()
        return session, {"title": row["title"], "pending": pending}

    # --- /status ----------------------------------------------------------------------

    async def status(self, call: CommandCall) -> None:
        session, extra = await self._open(call)
        stored = await self.store.sessions.load_window(session, max_messages=self.window_limit)
        window = visible(stored, session.metadata)
        tokens = estimate_tokens([m.content or "" for m in window])
        none = say("none", call.locale)
        text = say(
            "status",
            call.locale,
            session_key=session.key,
            agent=self.agent(call.event).name,
            generation=session.generation,
            title=extra["title"] or none,
            model=self.session_model(session, call.event),
            messages=len(window),
            tokens=tokens,
            skills=", ".join(session.metadata.get(SKILLS) or ()) or none,
            pending=extra["pending"],
        )
        await self._reply(call, text, session.id)

    # --- /whoami ----------------------------------------------------------------------

    async def whoami(self, call: CommandCall) -> None:
        event = call.event
        text = say(
            "whoami",
            call.locale,
            channel=event.channel,
            sender=event.sender_id,
            chat=event.chat_id,
            chat_type=event.chat_type.value,
            session_key=call.lease.key,
        )
        await self._reply(call, text, None)

    # --- /title -----------------------------------------------------------------------

    async def title(self, call: CommandCall) -> None:
        new = " ".join(call.args.split())
        if not new:
            session, extra = await self._open(call)
            shown = extra["title"] or say("none", call.locale)
            await self._reply(call, say("title.show", call.locale, title=shown), session.id)
            return
        if len(new) > TITLE_MAX:
            await self._reply(call, say("title.too_long", call.locale, max=TITLE_MAX), None)
            return
        await self._set(call, lambda _s: say("title.set", call.locale, title=new), title=new)

    # --- /model -----------------------------------------------------------------------

    async def model(self, call: CommandCall) -> None:
        allowed = self.models_for(call.event)
        name = call.args.strip()
        if not name:
            session, _ = await self._open(call)
            text = say(
                "model.show",
                call.locale,
                model=self.session_model(session, call.event),
                models=", ".join(allowed),
            )
            await self._reply(call, text, session.id)
            return
        if name not in allowed:
            text = say("model.unknown", call.locale, model=name, models=", ".join(allowed))
            await self._reply(call, text, None)
            return
        await self._set(call, lambda _s: say("model.set", call.locale, model=name), metadata={"model": name})

    # --- /sessions /resume ------------------------------------------------------------

    async def _generations(self, key: str) -> list[dict[str, Any]]:
        async with self.store.sessions.engine.connect() as conn:
            rows = (
                await conn.execute(
                    select(
                        sessions.c.id,
                        sessions.c.generation,
                        sessions.c.title,
                        sessions.c.status,
                        sessions.c.next_seq,
                        sessions.c.metadata,
                    )
                    .where(sessions.c.key == key)
                    .order_by(sessions.c.generation.desc())
                    .limit(SESSIONS_LISTED)
                )
            ).mappings()
            return [dict(r) for r in rows]

    async def sessions(self, call: CommandCall) -> None:
        session, _ = await self._open(call)
        lines = [say("sessions.title", call.locale)]
        for row in await self._generations(call.lease.key):
            mark = " *" if row["id"] == session.id else ""
            lines.append(
                say(
                    "sessions.line",
                    call.locale,
                    n=row["generation"],
                    title=row["title"] or say("untitled", call.locale),
                    messages=row["next_seq"] - 1,
                    status=row["status"],
                )
                + lineage(row["metadata"], call.locale)
                + mark
            )
        if self.senders is not None:
            others = await self.senders.elsewhere(call.event, call.lease.key, SESSIONS_LISTED)
            lines += elsewhere_lines(others, call.event.channel, call.locale)
        await self._reply(call, "\n".join(lines), session.id)

    async def resume(self, call: CommandCall) -> None:
        arg = call.args.strip()
        wanted = int(arg) if arg.isdigit() else None
        found = [r for r in await self._generations(call.lease.key) if r["generation"] == wanted]
        if wanted is None or not found:
            await self._reply(call, say("resume.unknown", call.locale, n=arg or "?"), None)
            return
        target = found[0]
        if target["status"] == "archived":
            await self._reply(call, say("resume.archived", call.locale, n=wanted), None)
            return
        await self.store.sessions.reopen(call.lease.key, target["id"], lease=call.lease)
        title = target["title"] or say("untitled", call.locale)
        await self._reply(call, say("resume.done", call.locale, n=wanted, title=title), target["id"])

    # --- /undo /retry -------------------------------------------------------------------

    async def _last_turn(self, call: CommandCall) -> tuple[SessionState, ChatMessage, int] | None:
        lease = call.lease
        async with self.store.fenced(lease) as conn:
            session = await self.store.sessions.open_current(
                conn, lease.key, conversation_channel(call.event), fence=lease.fence
            )
        found = last_turn(await self.store.sessions.all_messages(session.id), session.metadata)
        return None if found is None else (session, *found)

    async def undo(self, call: CommandCall) -> None:
        found = await self._last_turn(call)
        if found is None:
            await self._reply(call, say("undo.nothing", call.locale), None)
            return
        _, user, end = found
        by, at = call.event.sender_id, utcnow()

        def undone(metadata: dict[str, Any]) -> dict[str, Any]:
            return mark(metadata, user.seq or 0, end, why="undone", by=by, at=at)

        await self._set(call, lambda _s: say("undo.done", call.locale), metadata=undone)

    async def retry(self, call: CommandCall) -> Handled | None:
        found = await self._last_turn(call)
        if found is None or self.turns is None:
            await self._reply(call, say("retry.nothing", call.locale), None)
            return None
        session, user, end = found
        lease = call.lease
        async with self.store.fenced(lease) as conn:
            fresh = (
                await conn.execute(select(sessions.c.metadata).where(sessions.c.id == session.id))
            ).scalar() or {}
            marks = mark(fresh, user.seq or 0, end, why="superseded", by=call.event.sender_id, at=utcnow())
            await conn.execute(
                update(sessions)
                .where(sessions.c.id == session.id)
                .values(metadata=marks, updated_at=utcnow())
            )
        self.store.sessions.remember(lease.key, replace(session, metadata=marks), fence=lease.fence)
        # The retried message is appended again (history stays append-only) and answered.
        parts = [{"type": "text", "text": user.content or ""}, *(user.parts or ())]
        again = InboundEvent.model_validate({**call.event.model_dump(), "parts": parts})
        return await self.turns.run(lease, [replace(call.row, event=again)], None)

    # --- /compact -----------------------------------------------------------------------

    async def compact(self, call: CommandCall) -> None:
        """Consolidate now (thresholds ignored), then continue in a new generation that
        carries the old one's summaries, its title and model, linked to it."""
        if self.consolidator is None:
            await self._reply(call, say("compact.unavailable", call.locale), None)
            return
        lease, store = call.lease, self.store.sessions
        channel = conversation_channel(call.event)
        async with self.store.fenced(lease) as conn:
            old = await store.open_current(conn, lease.key, channel, fence=lease.fence)
        if old.message_count == 0:
            await self._reply(call, say("compact.nothing", call.locale), old.id)
            return
        await self.consolidator.consolidate(lease, old.id, force=True)
        async with self.store.fenced(lease) as conn:
            new, carried = await next_generation(conn, store, lease, old, channel)
            text = say("compact.done", call.locale, old=old.generation, new=new.generation, summaries=carried)
            await self.replies.answer(conn, call.row, text, session_id=new.id)
        self.replies.handled([call.row.event_id])

    # --- /agent -------------------------------------------------------------------------

    async def agent_command(self, call: CommandCall) -> None:
        assert self.agents is not None
        book, event = self.agents.book, call.event
        usable = book.usable(event.sender_id)
        current = self.agent(event).name
        name = call.args.strip()
        if not name:
            lines = [say("agent.title", call.locale)]
            for agent in usable:
                mark = " *" if agent.name == current else ""
                lines.append(
                    f"- {agent.name}" + (f" — {agent.description}" if agent.description else "") + mark
                )
            await self._reply(call, "\n".join(lines), None)
            return
        if name not in {a.name for a in usable}:
            names = ", ".join(a.name for a in usable)
            await self._reply(call, say("agent.unknown", call.locale, agent=name, agents=names), None)
            return
        await self.agents.choose(event, name)
        await self._reply(call, say("agent.switched", call.locale, agent=name), None)

    # --- /skills /skill -----------------------------------------------------------------

    async def list_skills(self, call: CommandCall) -> None:
        assert self.skills is not None
        available = self.skills.available(call.lease.key)
        session, _ = await self._open(call)
        async with self.store.sessions.engine.connect() as conn:
            loaded = await loaded_skills(conn, session.id)
        lines = [say("skills.title", call.locale)]
        for skill in available.values():
            mark_ = " *" if skill.name in loaded else ""
            lines.append(f"- {skill.name}: {skill.description}{mark_}")
        if not available:
            lines.append(say("none", call.locale))
        await self._reply(call, "\n".join(lines), session.id)

    async def skill(self, call: CommandCall) -> None:
        assert self.skills is not None
        arg = call.args.strip()
        unload = arg.startswith("-")
        name = arg.lstrip("-").strip()
        available = self.skills.available(call.lease.key)
        if not name or (not unload and name not in available):
            listed = ", ".join(available) or say("none", call.locale)
            await self._reply(call, say("skill.unknown", call.locale, skill=name or "?", skills=listed), None)
            return
        lease, store = call.lease, self.store.sessions
        async with self.store.fenced(lease) as conn:
            session = await store.open_current(
                conn, lease.key, conversation_channel(call.event), fence=lease.fence
            )
            loaded = await loaded_skills(conn, session.id)
            if unload:
                key = "skill.unloaded" if name in loaded else "skill.not_loaded"
                names = [n for n in loaded if n != name]
            else:
                key = "skill.loaded"
                names = loaded if name in loaded else [*loaded, name]
            metadata = await set_loaded(conn, session.id, names)
            store.remember(lease.key, replace(session, metadata=metadata), fence=lease.fence)
            await self.replies.answer(
                conn, call.row, say(key, call.locale, skill=name), session_id=session.id
            )
        self.replies.handled([call.row.event_id])


def lineage(metadata: Mapping[str, Any] | None, locale: str) -> str:
    """ ", from N" for a generation continued from N (/compact or a context overflow)."""
    link = (metadata or {}).get("compacted_from")
    if not isinstance(link, Mapping) or "generation" not in link:
        return ""
    return say("sessions.from", locale, n=link["generation"])
