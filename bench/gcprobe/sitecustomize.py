"""Loaded by every Python process started with this directory on PYTHONPATH.

With `CHATGATE_GC_LOG=<dir>` set, a `chatgate serve` process appends one line per
collection of the oldest generation (and any collection over 3 ms) to
`<dir>/gc-<pid>.txt`: when (unix time), which generation, how long (ms).
`bench_webhook_e2e --gc-log` uses it to show the garbage collector's pauses in the
serving processes.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from typing import Any

_DIR = os.environ.get("CHATGATE_GC_LOG")

if _DIR:
    _directory: str = _DIR
    _started = [0.0]

    def _on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        ms = (time.perf_counter() - _started[0]) * 1000
        if (info["generation"] == 2 or ms > 3) and "serve" in sys.argv:
            with open(os.path.join(_directory, f"gc-{os.getpid()}.txt"), "a") as out:
                out.write(f"{time.time():.3f} {info['generation']} {ms:.2f}\n")

    gc.callbacks.append(_on_gc)
