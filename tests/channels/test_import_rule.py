"""What a channel may import from `app`: the rule `docs/architecture.md` states, checked.

A channel adapter sees the contract (`app.channel`, `app.events`, `app.errors`), the
streaming contract (`app.streaming.protocol`, `app.streaming.settings`) and a few small
helpers that load nothing else (`app.connections`, `app.probe`, `app.signed_callback`).
Nothing of the pipeline, storage, tables or the preview hub: those would tie every
adapter to the runtime's internals.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from tests.support.servers import ROOT

ALLOWED = {
    "app.channel",
    "app.events",
    "app.errors",
    "app.streaming.protocol",
    "app.streaming.settings",
    "app.connections",
    "app.probe",
    "app.signed_callback",
    # The guarded fetcher every URL a payload controls goes through (`ChannelContext.fetcher`).
    "app.fetch",
    "app.fetch.addresses",
    "app.fetch.decode",
    "app.fetch.fetcher",
}
# The cron channel is the scheduler's front door: it reads the job store it fires from.
EXCEPTIONS = {
    "channels/cron": {"app.scheduling"},
    # The MCP server is a door into sessions, like the browser gateway: it reads them through
    # the session directory by the caller's grants (`app.gateway.tokens`), with its settings.
    "channels/mcp_server": {"app.gateway.tokens", "app.sessions.directory", "app.config"},
    # Personal WeChat's QR login and doctor check are operator tools run outside the server
    # (`chatgate channels weixin login`, `chatgate doctor`): they read the login kept in the
    # database. The adapter itself stays within the rule.
    "channels/weixin/cli.py": {"app.config", "app.channel_records", "app.db.engine"},
    "channels/weixin/doctor.py": {"app.channel_records", "app.db.engine"},
}


def _app_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "app" else [f"app.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n == "app" or n.startswith("app."))
    return found


def test_channels_import_only_the_allowed_app_modules() -> None:
    modules = sorted((ROOT / "channels").rglob("*.py"))
    assert len(modules) > 50  # the walk found the tree
    wrong: dict[str, set[str]] = {}
    for path in modules:
        relative = path.relative_to(ROOT).as_posix()
        extra = {
            e
            for prefix, allowed in EXCEPTIONS.items()
            if relative == prefix or relative.startswith(prefix + "/")
            for e in allowed
        }
        bad = _app_imports(path) - ALLOWED - extra
        if bad:
            wrong[relative] = bad
    assert wrong == {}, f"channel modules importing app internals: {wrong}"


def test_the_allowed_modules_load_nothing_else_of_app() -> None:
    """Importing a package runs its __init__: the allowed modules must not pull in the hub,
    the pipeline or the tables through a package face."""
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in sorted(ALLOWED))
        + "print('\\n'.join(sorted(m for m in sys.modules if m == 'app' or m.startswith('app.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert loaded - ALLOWED - {"app", "app.streaming"} == set()


def _foreign_privates(path: Path) -> list[str]:
    return _foreign_privates_under(path, ROOT)


def _foreign_privates_under(path: Path, root: Path) -> list[str]:
    """`x._name` where `x` is not `self`/`cls`: reading another object's private part."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.unparse(node)}")
    return found


def test_streamers_and_senders_use_public_seams_not_each_others_privates() -> None:
    """Each adapter's `Outbound` (send, edit, delete, typing, upload) is what its streamers
    use; nothing under channels/ reaches into another object's `_private` attributes."""
    found = [hit for path in sorted((ROOT / "channels").rglob("*.py")) for hit in _foreign_privates(path)]
    assert found == []


def test_the_private_rule_sees_a_reach_in(tmp_path: Path) -> None:
    module = tmp_path / "stream.py"
    module.write_text("async def f(self):\n    await self.channel._call()\n    self._ok = 1\n")
    hits = _foreign_privates_under(module, tmp_path)
    assert [hit.split(" ", 1)[1] for hit in hits] == ["self.channel._call"]


def test_the_rule_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "adapter.py"
    module.write_text(
        "from app.streaming import hub\nimport app.pipeline.replies\nfrom app.events import X\n"
    )
    assert _app_imports(module) == {"app.streaming", "app.pipeline.replies", "app.events"}
