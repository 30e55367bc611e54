"""python -m speclab.bench WHICH (see speclab/bench/cli.py)."""
from speclab.bench.cli import main

main()
