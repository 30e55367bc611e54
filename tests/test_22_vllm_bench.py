"""`python -m speclab.bench vs-vllm`: its registration, and the arithmetic of its rows (on made-up passes,
so that every field is known; the benchmark itself is run by hand: speed is never asserted in tests)."""

import pytest

from speclab.bench import cli as bench
from speclab.bench import vs_vllm as bench_vs_vllm
from speclab.bench.vs_vllm import summarize

FIELDS = {"engine", "batch", "method", "tok_per_s", "speedup_vs_plain", "acceptance_rate", "mean_acceptance_length",
          "identical_to_plain"}


def passes(seconds, tokens, counters=None, batch=1):
    return [{"batch": batch, "seconds": s, "tokens": tokens, "counters": counters} for s in seconds]


def test_vs_vllm_is_a_bench_subcommand_with_its_own_flags(capsys):
    with pytest.raises(SystemExit) as done:
        bench.main(["vs-vllm", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "--json" in out and "--threads" in out and "--repeats" in out and "--dtype" in out


def test_rows_report_medians_ratios_acceptance_and_identity():
    ref = [[1, 2, 3], [4, 5, 6]]
    spec_counters = {"num_drafts": 2, "num_draft_tokens": 8, "num_accepted_tokens": 4}
    rows = summarize("speclab", {
        "none": passes([2.0, 1.0, 9.0], ref),                               # median 2.0
        "ngram": passes([1.0, 0.5, 4.0], ref, spec_counters),               # median 1.0, counters summed x3
        "draft_model": passes([4.0], [[1, 2, 3], [4, 5, 7]], {"num_drafts": 0, "num_draft_tokens": 0,
                                                               "num_accepted_tokens": 0}),
    }, ref)
    by = {r["method"]: r for r in rows}
    assert all(FIELDS <= set(r) for r in rows)
    assert by["none"]["speedup_vs_plain"] == 1.0 and by["none"]["tok_per_s"] == 3.0      # 6 tokens / 2 s
    assert by["ngram"]["speedup_vs_plain"] == 2.0 and by["ngram"]["tok_per_s"] == 6.0
    assert by["ngram"]["acceptance_rate"] == 0.5 and by["ngram"]["mean_acceptance_length"] == 3.0
    assert by["none"]["acceptance_rate"] is None, "no counters (plain, transformers): no acceptance"
    assert by["draft_model"]["identical_to_plain"] is False and by["draft_model"]["identical_prompts"] == "1/2"
    assert by["draft_model"]["acceptance_rate"] is None, "nothing drafted: no rate rather than 0/0"
    assert by["ngram"]["identical_to_plain"] is True and by["ngram"]["repeats"] == 3


def test_a_row_without_a_plain_baseline_has_no_speedup():
    rows = summarize("transformers", {"ngram": passes([1.0], [[1]], batch=1)}, [[1]])
    assert rows[0]["speedup_vs_plain"] is None


def test_vllm_s_serialized_metrics_give_the_same_counters():
    listed = [{"type": "Counter", "name": "vllm:spec_decode_num_drafts", "labels": {}, "value": 3},
              {"type": "Counter", "name": "vllm:spec_decode_num_draft_tokens", "labels": {}, "value": 6},
              {"type": "Counter", "name": "vllm:spec_decode_num_accepted_tokens", "labels": {}, "value": 3},
              {"type": "Vector", "name": "vllm:spec_decode_num_accepted_tokens_per_pos", "labels": {},
               "values": [2, 1]}]
    c = bench_vs_vllm.counters(listed)
    assert c["num_accepted_tokens_per_pos"] == [2, 1] and c["mean_acceptance_length"] == 2.0
    assert bench_vs_vllm.delta(c, bench_vs_vllm.counters([])) == {"num_drafts": 3, "num_draft_tokens": 6,
                                                                  "num_accepted_tokens": 3}
