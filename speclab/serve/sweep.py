"""Moved to speclab.bench.sweep (the benchmarks live in speclab/bench/)."""
from speclab.bench.sweep import *  # noqa: F401,F403
