"""The commands people use to see and name their own session: /status /whoami /title
/model /sessions /resume. Each is one registry entry (`SessionCommands.commands`) and a
handler; the other families are `agent_commands` (/agent), `skill_commands` (/skills
/skill) and `history_commands` (/undo /retry /compact).

What a command changes is stored on the session row (`title`, `metadata["model"]`) through
the store's operations, under the key's lease like every write, so it survives a restart
and a new generation starts clean (`/new` forgets the chosen model).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from app.agents.profiles import DEFAULT_AGENT, AgentProfile, AgentRouter
from app.agents.senders import SessionSenders, elsewhere_lines
from app.agents.skills import SKILLS
from app.events import ChatType, InboundEvent
from app.pipeline.commands import Command, CommandCall
from app.pipeline.replies import Replies, conversation_channel
from app.pipeline.storage.port import PipelineStore
from app.pipeline.texts import say
from app.sessions.history_marks import visible
from app.sessions.profiles import MODEL, SessionModels

TITLE_MAX = 200
SESSIONS_LISTED = 10


def estimate_tokens(texts: Sequence[str]) -> int:
    """A rough token count (about four characters a token), for /status."""
    return sum((len(t) + 3) // 4 for t in texts)


def agent_of(agents: AgentRouter | None, event: InboundEvent) -> AgentProfile:
    """The agent serving `event` (the default one when the gateway has no agents file)."""
    return agents.agent_of(event) if agents is not None else AgentProfile(DEFAULT_AGENT)


class SessionCommands:
    def __init__(
        self,
        store: PipelineStore,
        replies: Replies,
        models: SessionModels,
        *,
        agents: AgentRouter | None = None,
        senders: SessionSenders | None = None,
        window_limit: int = 100,
    ) -> None:
        self.store = store
        self.replies = replies
        self.models = models
        self.agents = agents
        self.senders = senders  # /sessions lists the sender's other chats
        self.window_limit = window_limit

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

    async def _reply(self, call: CommandCall, text: str, session_id: int | None) -> None:
        await self.replies.answer(call.lease, call.row, text, session_id=session_id)

    # --- /status ----------------------------------------------------------------------

    async def status(self, call: CommandCall) -> None:
        opened = await self.store.open_session(call.lease, conversation_channel(call.event))
        session = opened.session
        stored = await self.store.sessions.load_window(session, max_messages=self.window_limit)
        window = visible(stored, session.metadata)
        tokens = estimate_tokens([m.content or "" for m in window])
        none = say("none", call.locale)
        text = say(
            "status",
            call.locale,
            session_key=session.key,
            agent=agent_of(self.agents, call.event).name,
            generation=session.generation,
            title=opened.title or none,
            model=self.models.shown(session, call.event),
            messages=len(window),
            tokens=tokens,
            skills=", ".join(session.metadata.get(SKILLS) or ()) or none,
            pending=opened.pending_approvals,
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
        channel = conversation_channel(call.event)
        if not new:
            opened = await self.store.open_session(call.lease, channel)
            shown = opened.title or say("none", call.locale)
            await self._reply(call, say("title.show", call.locale, title=shown), opened.session.id)
            return
        if len(new) > TITLE_MAX:
            await self._reply(call, say("title.too_long", call.locale, max=TITLE_MAX), None)
            return
        answer = self.replies.answer_of(call.row, say("title.set", call.locale, title=new))
        await self.store.set_session_metadata(call.lease, channel, title=new, answer=answer)
        self.replies.handled([call.row.event_id])

    # --- /model -----------------------------------------------------------------------

    async def model(self, call: CommandCall) -> None:
        allowed = self.models.choices(call.event, agent_of(self.agents, call.event).models)
        name = call.args.strip()
        channel = conversation_channel(call.event)
        if not name:
            session = (await self.store.open_session(call.lease, channel)).session
            text = say(
                "model.show",
                call.locale,
                model=self.models.shown(session, call.event),
                models=", ".join(allowed),
            )
            await self._reply(call, text, session.id)
            return
        if name not in allowed:
            text = say("model.unknown", call.locale, model=name, models=", ".join(allowed))
            await self._reply(call, text, None)
            return
        answer = self.replies.answer_of(call.row, say("model.set", call.locale, model=name))
        await self.store.set_session_metadata(call.lease, channel, {MODEL: name}, answer=answer)
        self.replies.handled([call.row.event_id])

    # --- /sessions /resume ------------------------------------------------------------

    async def sessions(self, call: CommandCall) -> None:
        session = (await self.store.open_session(call.lease, conversation_channel(call.event))).session
        lines = [say("sessions.title", call.locale)]
        for row in await self.store.generations(call.lease.key, SESSIONS_LISTED):
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
        # In a group only the group's own conversations: a sender's other chats are theirs.
        if self.senders is not None and call.event.chat_type is not ChatType.GROUP:
            others = await self.senders.elsewhere(call.event, call.lease.key, SESSIONS_LISTED)
            lines += elsewhere_lines(others, call.event.channel, call.locale)
        await self._reply(call, "\n".join(lines), session.id)

    async def resume(self, call: CommandCall) -> None:
        arg = call.args.strip()
        wanted = int(arg) if arg.isdigit() else None
        generations = await self.store.generations(call.lease.key, SESSIONS_LISTED)
        found = [r for r in generations if r["generation"] == wanted]
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


def lineage(metadata: Mapping[str, Any] | None, locale: str) -> str:
    """ ", from N" for a generation continued from N (/compact or a context overflow)."""
    link = (metadata or {}).get("compacted_from")
    if not isinstance(link, Mapping) or "generation" not in link:
        return ""
    return say("sessions.from", locale, n=link["generation"])
