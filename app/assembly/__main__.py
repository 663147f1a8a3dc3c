"""`python -m app.assembly --graph`: build the parts from the settings (nothing connects)
and print each part, what it holds of the others, and what was assigned into a part after
it was built. Exits 1 if anything was."""

from __future__ import annotations

import argparse
import asyncio
import sys

from app.assembly import assemble
from app.config import Settings


async def _graph() -> int:
    parts = assemble(Settings())
    try:
        print(parts.built.graph())
        return 1 if parts.built.changed() else 0
    finally:
        await parts.http.aclose()
        await parts.engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.assembly", description=__doc__)
    parser.add_argument("--graph", action="store_true", help="print the parts and what each holds")
    args = parser.parse_args(argv)
    if not args.graph:
        parser.print_help()
        return 0
    return asyncio.run(_graph())


if __name__ == "__main__":
    sys.exit(main())
