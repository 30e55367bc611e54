"""`speclab bench serve` against a local server: vLLM's result keys, counts that add up, Poisson
arrivals, acceptance from /metrics, the saved JSON; and the sweep's table on a saved result."""

import argparse
import json

import pytest

pytest.importorskip("openai", reason="the serve extra is not installed: pip install -e '.[serve]'")
pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")

from serve_helpers import NGRAM  # noqa: E402

from speclab.bench import serve as bench_serve  # noqa: E402
from speclab.serve.launch import running_server  # noqa: E402
from speclab.bench.sweep import median_points, table  # noqa: E402


def bench_args(*argv):
    p = argparse.ArgumentParser()
    bench_serve.add_bench_args(p)
    return p.parse_args(list(argv))


def test_bench_serve_reports_vllms_keys_and_saves_json(tmp_path, capsys):
    with running_server(["--speculative-config", NGRAM]) as url:
        host, port = url.removeprefix("http://").split(":")
        args = bench_args("--host", host, "--port", port, "--max-concurrency", "3", "--num-prompts", "6",
                          "--dataset-name", "copy", "--output-len", "12", "--ignore-eos", "--save-result",
                          "--result-dir", str(tmp_path), "--result-filename", "r.json")
        bench_serve.main(args)
        r = json.loads((tmp_path / "r.json").read_text())
        assert r["completed"] == 6 and r["failed"] == 0
        assert r["total_output_tokens"] == 6 * 12, "--ignore-eos: every request generates exactly --output-len"
        assert r["output_throughput"] == pytest.approx(r["total_output_tokens"] / r["duration"])
        for key in ["median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "p99_tpot_ms", "median_itl_ms", "p99_itl_ms",
                    "median_e2el_ms", "request_throughput", "max_concurrency", "spec_decode_acceptance_length"]:
            assert key in r, key
        assert 0 < r["spec_decode_acceptance_rate"] <= 100 and r["spec_decode_acceptance_length"] >= 1
        assert r["p99_ttft_ms"] >= r["median_ttft_ms"] > 0
        out = capsys.readouterr().out
        assert " Serving Benchmark Result " in out and "Acceptance length:" in out
        poisson = bench_serve.benchmark(bench_args("--request-rate", "20", "--num-prompts", "4", "--output-len", "4",
                                                   "--ignore-eos"), base_url=url, verbose=False)
        assert poisson["completed"] == 4 and poisson["request_rate"] == 20.0


def test_unknown_dataset_is_refused():
    with pytest.raises(ValueError, match="unknown --dataset-name"):
        bench_serve.load_dataset("sharegpt", None)


def test_sweep_table_uses_medians_over_passes():
    rows = [{"label": lab, "concurrency": c, "output_throughput": t, "median_tpot_ms": 1.0, "median_ttft_ms": 1.0,
             "median_itl_ms": 1.0}
            for lab, c, t in [("a", 1, 10), ("a", 1, 30), ("a", 1, 20), ("b", 1, 40), ("b", 1, 40), ("b", 1, 40),
                              ("c", 1, 38), ("c", 1, 38), ("c", 1, 0)]]
    data = {"settings": {"configs": [{"label": x} for x in "abc"], "concurrencies": [1], "repeats": 3}, "results": rows}
    assert median_points(data)[("a", 1)]["output_throughput"] == 20
    assert table(data).splitlines()[-1].split()[-1] == "0.95"  # 38 / max(20, 40)
