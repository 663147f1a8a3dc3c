"""Reproducible benchmarks; results are recorded in bench/RESULTS.md."""
