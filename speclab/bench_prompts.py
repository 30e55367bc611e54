"""Moved to speclab.bench.prompts (the benchmarks live in speclab/bench/)."""
from speclab.bench.prompts import *  # noqa: F401,F403
