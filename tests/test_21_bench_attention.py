"""`python -m speclab.bench attention` times whole forwards with the paged CPU attention kernel and
with torch's gather + SDPA path, and writes them as JSON. A smoke run on the embedded target;
speeds printed, never asserted."""

import json

import pytest

from speclab.bench.cli import main
from speclab.models import cpu_attention


@pytest.mark.skipif(not cpu_attention.available(), reason=f"kernel not built: {cpu_attention.why_unavailable()}")
def test_bench_attention_writes_both_paths_per_forward(tmp_path, capsys):
    path = tmp_path / "attention.json"
    main(["attention", "--rounds", "2", "--calls", "1", "--json", str(path)])
    report = json.loads(path.read_text())
    assert [r["forward"] for r in report["rows"]][:4] == ["batch 1 decode", "batch 1 verify (5 tokens)",
                                                          "batch 1 tree verify (root + 4 nodes)", "batch 8 decode"]
    for r in report["rows"]:
        assert r["kernel_ms"] > 0 and r["torch_ms"] > 0 and r["speedup_range"][0] <= r["speedup"] <= r["speedup_range"][1]
        assert r["argmax_identical"], r   # the two paths agree on the embedded target's tokens
    assert "load_average" in report["machine"] and "torch / kernel" in capsys.readouterr().out
    assert cpu_attention.applies.__name__ == "applies"   # the real test restored after the run


def test_more_threads_are_refused_with_the_fix():
    with pytest.raises(SystemExit, match="--threads 1"):
        main(["attention", "--threads", "2"])
