"""The assembly builds every part once, each from its constructor's arguments: nothing is
assigned into a part after it was built (`python -m app.assembly --graph` prints the same)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.assembly import assemble
from app.assembly.__main__ import main
from app.events import InboundEvent
from app.sessions.profiles import NoProfiles
from tests.conftest import make_settings, webhook_settings

AGENTS = """
default = "helper"
[[agents]]
name = "helper"
[[agents]]
name = "coder"
model = "big"
approvers = ["boss"]
"""


async def test_every_part_is_built_once_from_its_constructor_arguments(tmp_path: Path) -> None:
    agents_file = tmp_path / "agents.toml"
    agents_file.write_text(AGENTS)
    parts = assemble(
        make_settings(f"sqlite+aiosqlite:///{tmp_path}/a.db", agents_file=str(agents_file)),
        channel_settings={"webhook": webhook_settings()},
    )
    try:
        built = parts.built
        assert built.changed() == []
        names = list(built.parts)
        for index, name in enumerate(names):  # what a part holds was built before it
            assert set(built.holds(name)) <= set(names[:index]), name
        assert "agent_cmds" in names  # several agents: /agent is a family of its own
        # The turn asks the agent router what an agent says, from its constructor on.
        assert parts.turns.tools.profiles is parts.agents
        assert parts.turns.tools.approval_rules.profiles is parts.agents
        assert parts.turns.fit.profiles is parts.agents
        assert parts.turns.window.models is parts.models
        assert parts.turns.inbox_files is parts.inbox_files
        # One rule for the model: the agent's, else the channel's, else the provider's default.
        hello = InboundEvent.from_text("webhook", "c", "u", "hi")
        assert parts.models.base(hello.model_copy(update={"agent": "coder"})) == "big"
        assert parts.models.base(hello) is None
    finally:
        await parts.http.aclose()
        await parts.engine.dispose()


async def test_an_assignment_after_construction_is_reported(tmp_path: Path) -> None:
    parts = assemble(
        make_settings(f"sqlite+aiosqlite:///{tmp_path}/a.db"),
        channel_settings={"webhook": webhook_settings()},
    )
    try:
        parts.turns.tools.approval_rules.profiles = NoProfiles()  # what runtime.py did, 3 levels deep
        parts.handler.commands = parts.commands  # the same object again: not a change
        assert parts.built.changed() == ["turns.tools.approval_rules.profiles"]
    finally:
        await parts.http.aclose()
        await parts.engine.dispose()


def test_the_graph_names_every_part_and_no_assignment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DATABASE_URL", f"sqlite+aiosqlite:///{tmp_path}/graph.db")
    assert main(["--graph"]) == 0
    out = capsys.readouterr().out
    assert "turns            app.pipeline.turn.TurnRunner" in out
    assert out.rstrip().endswith("assigned after construction: nothing")
