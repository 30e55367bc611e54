"""Moved to speclab.bench.serve (the benchmarks live in speclab/bench/)."""
from speclab.bench.serve import *  # noqa: F401,F403
