"""Expand/contract: migrations the previous release can run against (docs/operations.md).

During a rolling upgrade the old release's replicas keep serving on the new schema, so a
migration may only *add* (expand). Removing or renaming something the old release uses
is two steps, one release apart:

1. expand: the code stops using the column (or table); the migration of that release
   says so in a module-level list, `deprecates = ["table.column"]` (or `["table"]`);
2. contract: a migration of a later release drops it and names the step it finishes,
   `contracts = {"table.column": "<revision that deprecated it>"}`.

A rename is never one step: add the new column, write both, read the new one, then
contract the old one. `violations()` reads each migration's `upgrade()` (everything but
`downgrade()`) without running it and lists every drop or rename that is neither a
contract step nor in `ALLOWED` (migrations that shipped before the rule, with a reason).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# (revision, what) -> why it is accepted although it is no two-step contract.
ALLOWED: Mapping[tuple[str, str], str] = {
    ("0006_no_channel_ix", "index:ix_sessions_channel"): (
        "a plain (non-unique) index: the old release only reads slower without it"
    ),
    ("0018_unfinished_indexes", "index:ix_inbox_status_id"): (
        "a plain index, replaced in the same migration by a partial index on the unfinished "
        "rows: the old release's queries give the same rows, planned on the new index"
    ),
    ("0018_unfinished_indexes", "index:ix_outbox_key_id"): (
        "a plain index, replaced in the same migration by a partial index on the undelivered "
        "rows: the old release's queries give the same rows, planned on the new index"
    ),
    ("0015_memory_namespace", "index:uq_memories_scope_owner_key"): (
        "shipped before the rule: replaced by a unique index with the namespace; old "
        "replicas' memory upserts fail on PostgreSQL until they are replaced (upgrade "
        "from before 0015 with a stop, not rolling)"
    ),
}

_RAW_SQL = re.compile(r"\b(DROP\s+(TABLE|COLUMN|INDEX|CONSTRAINT)|RENAME\s+(TO|COLUMN))\b", re.IGNORECASE)


@dataclass(frozen=True)
class Removal:
    revision: str
    what: str  # "table", "table.column", "index:name", "constraint:name" or "sql:<statement>"
    rename: bool = False
    line: int = 0


@dataclass(frozen=True)
class Migration:
    revision: str
    path: Path
    deprecates: frozenset[str]
    contracts: Mapping[str, str]
    removals: tuple[Removal, ...]


def read_migration(path: Path) -> Migration:
    tree = ast.parse(path.read_text(), str(path))
    names: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and node.value is not None:
                    try:
                        names[target.id] = ast.literal_eval(node.value)
                    except ValueError:
                        pass
    revision = str(names.get("revision", path.stem))
    body = [n for n in tree.body if not (isinstance(n, ast.FunctionDef) and n.name.startswith("downgrade"))]
    removals = tuple(_removals(revision, body))
    deprecates = names.get("deprecates", [])
    contracts = names.get("contracts", {})
    assert isinstance(deprecates, (list, tuple, set)) and isinstance(contracts, dict), path
    return Migration(revision, path, frozenset(map(str, deprecates)), dict(contracts), removals)


def _removals(revision: str, body: Iterable[ast.stmt]) -> Iterable[Removal]:
    module = ast.Module(body=list(body), type_ignores=[])
    tables: dict[str, str] = {}  # `with op.batch_alter_table("t") as batch` -> batch: t
    for node in ast.walk(module):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                call = item.context_expr
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "batch_alter_table"
                    and isinstance(item.optional_vars, ast.Name)
                ):
                    tables[item.optional_vars.id] = str(_arg(call, 0, "table_name"))
    for node in ast.walk(module):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and _RAW_SQL.search(node.value):
            yield Removal(revision, f"sql:{node.value.strip()[:80]}", line=node.lineno)
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        name = node.func.attr
        owner = node.func.value.id if isinstance(node.func.value, ast.Name) else ""
        batch_table = tables.get(owner)
        args = [batch_table] if batch_table is not None else []

        def arg(i: int, keyword: str, node: ast.Call = node, args: list[str] = args) -> object:
            return args[i] if i < len(args) else _arg(node, i - len(args), keyword)

        if name == "drop_table":
            yield Removal(revision, str(arg(0, "table_name")), line=node.lineno)
        elif name == "drop_column":
            yield Removal(revision, f"{arg(0, 'table_name')}.{arg(1, 'column_name')}", line=node.lineno)
        elif name == "rename_table":
            yield Removal(revision, str(arg(0, "old_table_name")), rename=True, line=node.lineno)
        elif name == "alter_column" and any(k.arg == "new_column_name" for k in node.keywords):
            yield Removal(
                revision, f"{arg(0, 'table_name')}.{arg(1, 'column_name')}", rename=True, line=node.lineno
            )
        elif name == "drop_index":
            yield Removal(revision, f"index:{_arg(node, 0, 'index_name')}", line=node.lineno)
        elif name == "drop_constraint":
            yield Removal(revision, f"constraint:{_arg(node, 0, 'constraint_name')}", line=node.lineno)


def _arg(call: ast.Call, index: int, keyword: str) -> object:
    if index < len(call.args):
        value = call.args[index]
    else:
        found = [k.value for k in call.keywords if k.arg == keyword]
        if not found:
            return "?"
        value = found[0]
    try:
        return ast.literal_eval(value)
    except ValueError:
        return ast.unparse(value)


def violations(
    migrations: Iterable[Migration], allowed: Mapping[tuple[str, str], str] = ALLOWED
) -> list[str]:
    """Every removal that is no documented contract step, as one line each (empty: all fine).

    `migrations` in chain order (oldest first): a contract must finish a deprecation made
    by an *earlier* migration.
    """
    problems: list[str] = []
    deprecated_by: dict[str, str] = {}  # what -> the revision that deprecated it
    for migration in migrations:
        for removal in migration.removals:
            where = f"{migration.path.name}:{removal.line} ({removal.what})"
            if (migration.revision, removal.what) in allowed:
                continue
            if removal.rename:
                problems.append(f"{where}: a rename in one step; add the new one, contract the old later")
                continue
            step = migration.contracts.get(removal.what)
            if step is None:
                problems.append(
                    f"{where}: dropped without the two-step; deprecate it first (`deprecates`), "
                    "drop it one release later (`contracts`)"
                )
            elif deprecated_by.get(removal.what) != step:
                problems.append(
                    f"{where}: contracts {removal.what!r} of {step!r}, which did not deprecate it"
                )
        for what in migration.deprecates:
            deprecated_by.setdefault(what, migration.revision)
    return problems


def chain(versions: Path) -> list[Migration]:
    """The migrations of `versions` in chain order (each after its `down_revision`)."""
    found = {m.revision: m for m in map(read_migration, sorted(versions.glob("*.py")))}
    parents: dict[str, str | None] = {}
    for revision, migration in found.items():
        tree = ast.parse(migration.path.read_text())
        parents[revision] = None
        for node in tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                if isinstance(target, ast.Name) and target.id == "down_revision" and node.value is not None:
                    value = ast.literal_eval(node.value)
                    parents[revision] = value if isinstance(value, str) else None
    depth: dict[str, int] = {}

    def level(revision: str) -> int:
        if revision not in depth:
            parent = parents.get(revision)
            depth[revision] = 0 if parent is None or parent not in found else level(parent) + 1
        return depth[revision]

    return sorted(found.values(), key=lambda m: (level(m.revision), m.revision))
