"""What `doctor` says of each replication set-up (the live cases run in
tests/hardening/test_failover.py and tests/app/db/test_multihost.py)."""

from __future__ import annotations

from app.db.replication import Replication


def test_asynchronous_standbys_are_a_warning_that_names_the_risk() -> None:
    verdict, detail = Replication(False, (), ("walreceiver",), "on").verdict()
    assert verdict == "warn"
    assert "acknowledged events can be lost on failover" in detail


def test_a_synchronous_standby_without_synchronous_commit_is_a_warning_too() -> None:
    verdict, _ = Replication(False, ("s1",), (), "local").verdict()
    assert verdict == "warn"


def test_a_synchronous_standby_passes_and_asynchronous_ones_beside_it_are_named() -> None:
    verdict, detail = Replication(False, ("s1",), ("s2",), "on").verdict()
    assert verdict == "ok" and "s1" in detail and "asynchronous too: s2" in detail
