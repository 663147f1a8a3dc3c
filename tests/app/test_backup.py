"""`chatgate backup` and `restore` on both stores: a restore into a new database has the
rows of every table, and the conversation reads the same."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from app.backup import BackupError, backup, restore, table_counts
from tests.app.test_cli import _cli
from tests.conftest import WEBHOOK_SECRET, ServeApp
from tests.support.db import database
from tests.support.webhook import post_webhook

pytestmark = pytest.mark.slow


async def test_backup_then_restore_into_a_new_database(serve: ServeApp, db_url: str, tmp_path: Path) -> None:
    async with serve() as srv, httpx.AsyncClient(timeout=60) as client:
        for n in range(3):
            resp = await post_webhook(
                client,
                srv.url,
                WEBHOOK_SECRET,
                {"chat_id": f"c{n % 2}", "sender_id": "u", "text": f"hi {n}"},
                wait=True,
            )
            assert resp.status_code == 200, resp.text
    kind = "sqlite" if db_url.startswith("sqlite") else "postgres"
    dump = tmp_path / "chatgate.backup"
    backed_up = await backup(db_url, dump)
    assert backed_up["messages"] >= 6 and backed_up["inbox"] == 3 and backed_up["outbox"] == 3
    with pytest.raises(BackupError, match="exists"):
        await backup(db_url, dump)  # never overwritten

    target_dir = tmp_path / "restored"
    target_dir.mkdir()
    async with database(kind, target_dir, migrated=False) as new_url:
        restored = await restore(new_url, dump)
        assert restored == backed_up
        with pytest.raises(BackupError, match="new, empty database"):
            await restore(new_url, dump)  # never over a database in use
        assert await table_counts(new_url) == backed_up


async def test_the_cli_backs_up_and_restores_sqlite(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'live.db'}"
    migrated = _cli(["migrate"], tmp_path, DATABASE_URL=db)
    assert migrated.returncode == 0, migrated.stderr
    done = _cli(["backup", str(tmp_path / "b.db"), "--json"], tmp_path, DATABASE_URL=db)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    again = _cli(
        ["restore", str(tmp_path / "b.db"), "--json"],
        tmp_path,
        DATABASE_URL=f"sqlite:///{tmp_path / 'new.db'}",
    )
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == counts
    refused = _cli(["restore", str(tmp_path / "b.db")], tmp_path, DATABASE_URL=db)
    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        "chatgate: restore failed: the target database already has chatgate tables: "
        "restore into a new, empty database"
    )
