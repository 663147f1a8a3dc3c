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

_TOTALS = os.environ.get("CHATGATE_GC_TOTALS")

if _TOTALS:
    import signal

    _totals_file: str = _TOTALS
    # Per generation: collections, milliseconds of this thread's CPU, objects collected
    # (CPU time, not wall time: on a shared machine a collection can be preempted).
    _counts = [[0, 0.0, 0] for _ in range(3)]
    _since = [0.0]

    def _count_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            _since[0] = time.thread_time()
            return
        entry = _counts[info["generation"]]
        entry[0] += 1
        entry[1] += (time.thread_time() - _since[0]) * 1000
        entry[2] += info["collected"]

    def _dump_totals(_signum: int, _frame: Any) -> None:
        # One line per SIGUSR1: the cumulative totals of each generation.
        fields = " ".join(f"{n} {ms:.3f} {collected}" for n, ms, collected in _counts)
        with open(_totals_file, "a") as out:
            out.write(f"{time.time():.3f} {fields}\n")

    gc.callbacks.append(_count_gc)
    signal.signal(signal.SIGUSR1, _dump_totals)

_CALLS = os.environ.get("CHATGATE_CALLS")

if _CALLS and "serve" in sys.argv:
    import cProfile
    import signal

    _calls_file: str = _CALLS
    _profile = [cProfile.Profile()]

    def _calls_mark(_signum: int, _frame: Any) -> None:
        # First SIGUSR2: start counting (the measured span begins); second: stop and dump.
        current = _profile[0]
        current.disable()
        if not os.path.exists(_calls_file + ".started"):
            open(_calls_file + ".started", "w").close()
            _profile[0] = cProfile.Profile()
            _profile[0].enable()
        else:
            current.dump_stats(_calls_file)

    signal.signal(signal.SIGUSR2, _calls_mark)
