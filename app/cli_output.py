"""How the `chatgate` commands print: JSON for scripts, a plain table for people."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, default=str, ensure_ascii=False))


def print_table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    """A plain text table of `columns` (missing values blank)."""
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    if not rows:
        print("(none)")
