"""Moved to speclab.bench.heads (the benchmarks live in speclab/bench/)."""
from speclab.bench.heads import *  # noqa: F401,F403
