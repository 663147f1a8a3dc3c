"""Expand/contract is checked: no migration drops or renames what the previous release uses
without the documented two-step (`app.migration_rules`, docs/operations.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.migration_rules import ALLOWED, chain, violations

VERSIONS = Path(__file__).resolve().parents[2] / "migrations" / "versions"

HEADER = 'from alembic import op\nimport sqlalchemy as sa\nrevision = "{rev}"\ndown_revision = {down!r}\n'


def test_the_migrations_on_this_branch_keep_expand_contract() -> None:
    migrations = chain(VERSIONS)
    assert migrations[0].revision.startswith("0001")
    assert violations(migrations) == []


def test_every_allowlisted_removal_still_exists() -> None:
    """An allowlist entry whose migration no longer does what it excuses is stale."""
    removals = {(r.revision, r.what) for m in chain(VERSIONS) for r in m.removals}
    assert set(ALLOWED) <= removals


def _write(tmp_path: Path, name: str, down: str | None, body: str) -> None:
    (tmp_path / f"{name}.py").write_text(HEADER.format(rev=name, down=down) + body)


@pytest.mark.parametrize(
    "upgrade",
    [
        'def upgrade():\n    op.drop_column("sessions", "title")\n',
        'def upgrade():\n    op.drop_table("runs")\n',
        'def upgrade():\n    op.alter_column("sessions", "title", new_column_name="name")\n',
        'def upgrade():\n    op.rename_table("runs", "agent_runs")\n',
        'def upgrade():\n    with op.batch_alter_table("sessions") as b:\n        b.drop_column("title")\n',
        'def upgrade():\n    op.execute("ALTER TABLE sessions DROP COLUMN title")\n',
        'def upgrade():\n    _helper()\n\ndef _helper():\n    op.drop_column("sessions", "title")\n',
    ],
)
def test_a_drop_or_rename_in_one_step_is_refused(tmp_path: Path, upgrade: str) -> None:
    _write(tmp_path, "0100_base", None, "def upgrade():\n    pass\n")
    _write(tmp_path, "0101_change", "0100_base", upgrade + "\ndef downgrade():\n    pass\n")
    [problem] = violations(chain(tmp_path), allowed={})
    assert "0101_change.py" in problem


def test_what_downgrade_drops_is_no_concern(tmp_path: Path) -> None:
    _write(
        tmp_path,
        "0100_add",
        None,
        'def upgrade():\n    op.add_column("sessions", sa.Column("x", sa.Text()))\n\n'
        'def downgrade():\n    op.drop_column("sessions", "x")\n',
    )
    assert violations(chain(tmp_path), allowed={}) == []


def test_a_drop_one_step_after_its_deprecation_is_the_contract(tmp_path: Path) -> None:
    _write(tmp_path, "0100_expand", None, 'deprecates = ["sessions.title"]\ndef upgrade():\n    pass\n')
    _write(
        tmp_path,
        "0101_contract",
        "0100_expand",
        'contracts = {"sessions.title": "0100_expand"}\n'
        'def upgrade():\n    op.drop_column("sessions", "title")\n',
    )
    assert violations(chain(tmp_path), allowed={}) == []


def test_a_contract_of_a_step_that_deprecated_nothing_is_refused(tmp_path: Path) -> None:
    _write(tmp_path, "0100_expand", None, "def upgrade():\n    pass\n")
    _write(
        tmp_path,
        "0101_contract",
        "0100_expand",
        'contracts = {"sessions.title": "0100_expand"}\n'
        'deprecates = ["sessions.title"]\n'  # deprecated and dropped in one migration
        'def upgrade():\n    op.drop_column("sessions", "title")\n',
    )
    [problem] = violations(chain(tmp_path), allowed={})
    assert "did not deprecate it" in problem
