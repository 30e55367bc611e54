"""`python -m speclab.bench heads` runs every proposer side by side and prints figures that add up.

A smoke run on the embedded target (one prompt per set, 8 tokens, greedy): one row per method and
set, speedups relative to the plain row (which reads exactly 1.00x), tau >= 1, alpha in [0, 1], and
acceptance per position that never rises with the position (a later drafted token is accepted
only after every earlier one was). Speeds are printed, never asserted.
"""

import re

import pytest

from speclab.bench.cli import main
from speclab.bench.heads import EMBEDDED_METHODS

ROW = re.compile(r"^(?P<set>\w+)\s+(?P<T>[\d.]+)\s+(?P<method>\w+)\s+(?P<toks>[\d.]+)\s+(?P<speedup>[\d.]+)x"
                 r"\s+(?P<pred>[\d.]+)x\s+(?P<pred2>[\d.]+)x\s+(?P<c>[\d.]+)\s+(?P<alpha>[\d.]+|nan)\s+(?P<tau>[\d.]+)"
                 r"(?P<per_pos>(\s+[\d.]+)*)\s*$")


@pytest.mark.slow  # seven engines on the embedded target, about 30 s
def test_bench_heads_prints_one_consistent_row_per_method_and_set(capsys):
    main(["heads", "--max-tokens", "8", "--num-prompts", "1", "--temperatures", "0", "--k", "3"])
    rows = [m.groupdict() for line in capsys.readouterr().out.splitlines() if (m := ROW.match(line))]
    assert {(r["set"], r["method"]) for r in rows} == {(s, m) for s in ("code", "prose")
                                                       for m in ("none",) + EMBEDDED_METHODS}
    for r in rows:
        if r["method"] == "none":
            assert r["speedup"] == "1.00" and r["tau"] == "1.00"
            continue
        per_pos = [float(x) for x in r["per_pos"].split()]
        assert len(per_pos) == 3, r
        assert all(a >= b - 1e-9 for a, b in zip(per_pos, per_pos[1:])), f"acceptance rose with position: {r}"
        assert 0 <= float(r["alpha"]) <= 1 and 1 <= float(r["tau"]) <= 4, r
        assert abs(float(r["tau"]) - (1 + sum(per_pos))) < 0.02, f"tau != 1 + sum of per-position acceptance: {r}"
