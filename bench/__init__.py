"""Benchmarks, run by hand: ``.venv/bin/python -m bench.poll`` etc. Results in docs/benchmarks.md."""
