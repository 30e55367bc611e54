"""Dynamic speculation: vLLM's num_speculative_tokens_per_batch_size and speclab's adaptive policy.
Outputs stay exact whatever k a step uses; the table is read as vLLM reads it; the adaptive policy
picks the k its cost model says is fastest, and probes while speculation is off."""

import pytest

from speclab import LLM, SamplingParams
from speclab.data.prompts import load_prompts
from speclab.engine.spec_policy import AdaptivePolicy, BatchSizeSchedule
from speclab.metrics import SpecDecodingStats
from speclab.spec_config import SpeculativeConfig, parse_batch_size_table

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


def test_table_from_json_object_or_list():
    assert parse_batch_size_table({"17-64": 2, "1-16": 3, "65-4096": 0}, 4) == [(1, 16, 3), (17, 64, 2), (65, 4096, 0)]
    assert parse_batch_size_table([[1, 16, 3], [65, 128, 0]], 3) == [(1, 16, 3), (65, 128, 0)]
    cfg = SpeculativeConfig.from_dict({**NGRAM, "num_speculative_tokens_per_batch_size": {"1-8": 4, "9-99": 0}})
    assert cfg.num_speculative_tokens_per_batch_size == [(1, 8, 4), (9, 99, 0)]


def test_table_as_vllm_reads_it_k_above_the_maximum_is_clamped():
    assert parse_batch_size_table({"1-16": 5, "17-64": 2}, 4) == [(1, 16, 4), (17, 64, 2)]


@pytest.mark.parametrize("table, needle", [
    ({"1-16": -1}, "k must be >= 0"),
    ({"2-16": 3, "17-64": 0}, "start at batch size 1"),
    ({"1-16": 2, "10-20": 0}, "overlap"),
    ({"16": 2}, "not 'start-end'"),
    ({"8-4": 2}, "start <= end"),
    ({"0-4": 2}, "start <= end"),
    ([[1, 4]], "[start, end, k]"),
    ({"1-4": 1.5}, "integers"),
    ({}, "empty"),
    (3, "maps inclusive batch-size ranges"),
])
def test_bad_tables_are_refused_with_the_fix(table, needle):
    with pytest.raises(ValueError) as e:
        SpeculativeConfig.from_dict({**NGRAM, "num_speculative_tokens_per_batch_size": table})
    assert needle in str(e.value)


def test_disable_by_batch_size_tells_its_story_and_names_the_replacement():
    with pytest.raises(ValueError, match="removed.*num_speculative_tokens_per_batch_size"):
        SpeculativeConfig.from_dict({**NGRAM, "disable_by_batch_size": 8})


def test_table_and_adaptive_are_exclusive():
    with pytest.raises(ValueError, match="not both"):
        SpeculativeConfig.from_dict({**NGRAM, "adaptive": True, "num_speculative_tokens_per_batch_size": {"1-4": 2}})
    with pytest.raises(ValueError, match="true or false"):
        SpeculativeConfig.from_dict({**NGRAM, "adaptive": "yes"})


def test_schedule_lookup_inclusive_ranges_gaps_inherit_and_k_is_capped():
    s = BatchSizeSchedule(4, [(2, 4, 3), (8, 16, 1), (32, 64, 0)])
    got = {b: s.k_for_batch_size(b) for b in (1, 2, 4, 5, 7, 8, 16, 17, 31, 32, 64, 65, 1000)}
    assert got == {1: 4, 2: 3, 4: 3, 5: 3, 7: 3, 8: 1, 16: 1, 17: 1, 31: 1, 32: 0, 64: 0, 65: 0, 1000: 0}


@pytest.mark.parametrize("extra", [{"num_speculative_tokens_per_batch_size": {"1-2": 4, "3-64": 0}},
                                   {"num_speculative_tokens_per_batch_size": {"1-4": 1, "5-64": 3}},
                                   {"adaptive": True}])
def test_outputs_are_exact_whatever_k_each_step_uses(extra):
    prompts = load_prompts("copy")[:6]
    plain = LLM(max_num_seqs=8).generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    llm = LLM(speculative_config={**NGRAM, **extra}, max_num_seqs=8)
    llm.engine.trace = []
    got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in plain]
    seeded = SamplingParams(temperature=0.8, max_tokens=24, seed=3)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, seeded, use_tqdm=False)] == \
        [o.outputs[0].token_ids for o in LLM().generate(prompts, seeded, use_tqdm=False)]
    policy = llm.engine.spec_policy
    assert policy.history and set(policy.history) <= set(range(5))
    if "num_speculative_tokens_per_batch_size" in extra:
        drafted = [len(d) for _, d, _ in llm.engine.trace]
        assert max(drafted) <= 4
        assert list(policy.history) == [policy.k_for_batch_size(b) for b in policy.batch_sizes]


def test_schedule_turns_speculation_off_at_large_batches():
    llm = LLM(speculative_config={**NGRAM, "num_speculative_tokens_per_batch_size": {"1-1": 4, "2-64": 0}})
    llm.generate(load_prompts("copy")[:4], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
    p = llm.engine.spec_policy
    assert all(k == (4 if b == 1 else 0) for k, b in zip(p.history, p.batch_sizes))


def synthetic(policy, alpha: float, a: float, b: float, steps: int = 200, batch_size: int = 8, k: int = 4,
              c: float = 0.0):
    """Feed a policy steps measured under a known cost model: T = a + b N + c R, free drafting, acceptance alpha."""
    stats = SpecDecodingStats(k)
    for i in range(steps):
        kk = policy.choose(batch_size)
        n = batch_size * (1 + kk)
        for _ in range(batch_size):
            if kk:
                acc = 0
                while acc < kk and (i * 7919 + acc * 104729) % 1000 < 1000 * alpha:
                    acc += 1
                stats.observe(kk, acc)
        r = batch_size if kk else 0
        policy.observe(num_tokens=n + (i % 3), decode_only=True, target_seconds=a + b * (n + (i % 3)) + c * r,
                       batch_size=batch_size, num_drafted=kk * batch_size, num_requested=kk * batch_size, k=kk,
                       draft_seconds=0.0, stats=stats, num_verifying=r, num_with_drafts=batch_size if kk else 0)
    return policy


def test_adaptive_speculates_when_compute_is_spare_and_stops_when_it_is_not():
    memory_bound = synthetic(AdaptivePolicy(4), alpha=0.8, a=0.020, b=0.0001, batch_size=1)
    assert memory_bound.k_for_batch_size(1) >= 3, memory_bound.fit()
    compute_bound = synthetic(AdaptivePolicy(4), alpha=0.3, a=0.001, b=0.002, batch_size=64)
    m = compute_bound.fit()
    assert AdaptivePolicy.predicted_throughput(m, 64, 0) > AdaptivePolicy.predicted_throughput(m, 64, 1)
    ks = list(compute_bound.history)[-64:]
    assert ks.count(0) >= 56 and ks.count(4) >= 2, "mostly off, with a probe of k_max one step in probe_every"


def test_adaptive_learns_the_cost_of_a_request_with_drafts():
    """A step costs c more per request that verifies drafts (beyond its tokens): the fit finds c, and
    with c large enough drafting stops paying even though tokens are cheap."""
    p = synthetic(AdaptivePolicy(4), alpha=0.5, a=0.01, b=0.0002, c=0.004, batch_size=16)
    m = p.fit()
    assert m["c"] == pytest.approx(0.004, rel=0.05) and m["b"] == pytest.approx(0.0002, rel=0.2), m
    assert AdaptivePolicy.predicted_throughput(m, 16, 0) > max(AdaptivePolicy.predicted_throughput(m, 16, k)
                                                               for k in range(1, 5))
    cheap = synthetic(AdaptivePolicy(4), alpha=0.5, a=0.01, b=0.0002, c=0.0, batch_size=16)
    assert cheap.k_for_batch_size(16) > 0, cheap.fit()


def test_adaptive_model_is_lesson_02s_formula():
    m = {"a": 1.0, "b": 0.0, "c": 0.0, "d0": 0.1, "d1": 0.0, "alpha": 0.5, "fill": 1.0, "share": 1.0}
    # (1 - alpha^(k+1)) / (1 - alpha) tokens over a target step plus k draft steps of c = 0.1
    for k in range(5):
        want = (1 - 0.5 ** (k + 1)) / 0.5 / (1 + 0.1 * k)
        assert AdaptivePolicy.predicted_throughput(m, 1, k) == pytest.approx(want)
