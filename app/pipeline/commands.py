"""Chat commands: each is one entry in one registry, with its handler.

A message whose first word names a registered command (`/new`, `/stop@mybot`, case
insensitive) is handled by that command instead of the model. An entry says:

- `help`: one line per language (`/help` lists the commands from these);
- `usage`: its arguments, shown by `/help`;
- `in_turn`: a running turn acts on it while it runs (`/stop`): it is not queued behind
  the turn; when no turn runs it is handled like any other command;
- `allowed`: who may use it (None: anyone); others get a polite refusal (`handling`);
- `role`: the least role (`app.access.roles`) a sender needs in the chat; None takes the
  default: `admin` for the commands that change a group's shared conversation
  (`SHARED_CONVERSATION`, opened to members per channel by `conversation_commands`),
  anyone for the rest. In a direct chat the sender is the owner, so only groups see it.

Adding a command is one `Command` in `app.pipeline.builtin_commands` (or `CommandRegistry.add`
from elsewhere) and its handler; nothing else in the pipeline names commands.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass

from app.access.roles import Role
from app.events import InboundEvent, native_of
from app.pipeline.storage.port import InboxRow
from app.pipeline.texts import say
from app.pipeline.turn_state import Handled
from app.sessions.lease import SessionLease


@dataclass(frozen=True)
class CommandCall:
    """One use of a command: the event's row (its attempt counted), under the key's lease."""

    lease: SessionLease
    row: InboxRow
    name: str  # as registered ("/new")
    args: str  # the rest of the text
    locale: str

    @property
    def event(self) -> InboundEvent:
        return self.row.event


# A handler that runs a turn itself (/retry) returns the turn's `Handled`, else None.
CommandHandler = Callable[[CommandCall], Awaitable[Handled | None]]


@dataclass(frozen=True)
class Command:
    name: str
    help: Mapping[str, str]
    run: CommandHandler
    usage: str = ""
    in_turn: bool = False
    allowed: Callable[[InboundEvent], bool] | None = None
    role: Role | None = None


# What changes the conversation everyone in a group shares: admin by default. Kept here,
# not on each entry, so a channel's `conversation_commands` opens the same set everywhere.
SHARED_CONVERSATION = frozenset(
    {
        "/new",
        "/reset",
        "/end",
        "/undo",
        "/retry",
        "/model",
        "/title",
        "/compact",
        "/agent",
        "/skill",
        "/handoff",
        "/resume",
    }
)


def required_role(command: Command, conversation_commands: str = "admin") -> Role:
    """The least role that may run `command` (`conversation_commands`: the channel's setting)."""
    if command.role is not None:
        return command.role
    if command.name in SHARED_CONVERSATION:
        return Role.MEMBER if conversation_commands == "member" else Role.ADMIN
    return Role.GUEST


# The registry entry that handles platform-native events (edits, recalls, reactions, joins,
# button presses: `app.pipeline.platform_events`). No one can type it: it has no `/`.
# Like a command, such an event is handled on its own: never merged into a turn or steered.
NATIVE_EVENTS = "platform-event"


def command_word(text: str) -> tuple[str, str]:
    """The first word of `text` as a command name (lower case, `@bot` dropped) and the rest."""
    stripped = text.strip()
    if not stripped.startswith("/"):
        return "", stripped
    word, _, rest = stripped.partition(" ")
    return word.split("@", 1)[0].lower(), rest.strip()


class CommandRegistry:
    def __init__(self, commands: Iterable[Command] = ()) -> None:
        self._commands: dict[str, Command] = {}
        self._native: dict[str, Command] = {}  # NATIVE_EVENTS: handled, never listed
        for command in commands:
            self.add(command)

    def add(self, command: Command) -> None:
        if command.name == NATIVE_EVENTS:
            if command.name in self._native:
                raise ValueError(f"command {command.name} is registered twice")
            self._native[command.name] = command
            return
        if command.name in self._commands:
            raise ValueError(f"command {command.name} is registered twice")
        self._commands[command.name] = command

    def __iter__(self) -> Iterator[Command]:
        return iter(self._commands.values())

    def find(self, event: InboundEvent) -> tuple[Command, str] | None:
        """The command `event` uses, and its arguments; None for a plain message."""
        if native_of(event) is not None:
            native = self._native.get(NATIVE_EVENTS)
            return None if native is None else (native, "")
        name, args = command_word(event.text)
        command = self._commands.get(name)
        return None if command is None else (command, args)

    def is_command(self, row: InboxRow) -> bool:
        return self.find(row.event) is not None

    def is_in_turn(self, row: InboxRow) -> bool:
        """Whether a running turn acts on this row itself (`/stop`)."""
        found = self.find(row.event)
        return found is not None and found[0].in_turn

    def help_text(self, locale: str) -> str:
        lines = [say("help.title", locale)]
        for command in self._commands.values():
            usage = f" {command.usage}" if command.usage else ""
            text = command.help.get(locale, command.help.get("en", ""))
            lines.append(f"{command.name}{usage} — {text}")
        return "\n".join(lines)
