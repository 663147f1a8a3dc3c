"""The built package holds everything the service needs outside a checkout.

The Dockerfile copies `pyproject.toml`, `README.md`, `app/`, `channels/` and
`migrations/` and runs `pip install .`; the image then serves from the installed
package. This builds the wheel from the same files and checks that every module,
migration, template and static asset of the source tree is in it: a directory without
`__init__.py` or a file type missing from the package data would otherwise only show
up as a broken container. (`scripts/check_package.sh` goes on to install and serve it.)
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("app", "channels", "migrations")


def _source_files() -> set[str]:
    found = set()
    for top in SHIPPED:
        for path in (ROOT / top).rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            found.add(path.relative_to(ROOT).as_posix())
    return found


def test_the_wheel_ships_every_module_migration_and_asset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for top in SHIPPED:
        shutil.copytree(ROOT / top, src / top, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip, "-w", str(out), "."],
        cwd=src,
        check=True,
        capture_output=True,
    )
    [wheel] = list(out.glob("chatgate-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        shipped = {name for name in archive.namelist() if name.split("/", 1)[0] in SHIPPED}
        entry_points = archive.read(next(n for n in archive.namelist() if n.endswith("entry_points.txt")))

    missing = sorted(_source_files() - shipped)
    assert not missing, f"not in the wheel: {missing}"
    assert any(name.startswith("migrations/versions/") for name in shipped)
    assert b"chatgate = app.cli:main" in entry_points
