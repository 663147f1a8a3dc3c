"""deploy/prometheus/alerts.yml: valid for promtool, its unit tests pass, and every metric
it names is one chatgate exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from app.metrics import Metrics

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: apt-get install prometheus (scripts/test.sh does)")
    return found


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        done = subprocess.run([_promtool(), *args], cwd=RULES, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_rules_name_is_exported() -> None:
    exported: set[str] = set()
    for family in Metrics().registry.collect():
        exported.add(family.name)
        if family.type == "counter":
            exported.add(family.name + "_total")
        exported.update(sample.name for sample in family.samples)
    named = set(re.findall(r"\b((?:chatgate|process)_[a-z_]+)", (RULES / "alerts.yml").read_text()))
    assert named and named <= exported, named - exported
