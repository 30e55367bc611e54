"""speculative_config's `draft_dtype` (speclab's key): a model drafter in bfloat16 beside a float32 target.

Drafts only propose, so a drafter in another dtype may change which tokens are drafted and how many are
accepted, never the output: greedy output stays plain greedy output, token for token, with every head
method and the draft model, under budgets and preemption. The drafter must really run in its dtype
(weights, its KV cache, its reduced LM head), or the knob would cost nothing and save nothing.
"""

import pytest
import torch

from speclab.llm import LLM
from speclab.models.heads import build_head, new_config
from speclab.sampling_params import SamplingParams
from speclab.spec_config import SpeculativeConfig
from tests.helpers import run_engine
from tests.test_08_heads import PROPOSERS, SCHEDULES, V, engine, tiny  # noqa: F401 (tiny: the target fixture)


def bf16_head(target, method, draft_vocab_size=None):
    torch.manual_seed(1)
    layers = (0, 2, 4) if method == "eagle3" else None
    head = build_head(new_config(method, target, hidden_layers=layers, num_heads=4 if method == "medusa" else 0,
                                 draft_vocab_size=draft_vocab_size), target)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "linear.weight" in name:  # Medusa's zero-initialised residual: give it something to do
                p.normal_(0, 0.3)
        if draft_vocab_size:
            head.d2t.copy_(torch.randperm(V)[:draft_vocab_size].sort().values)
    return head.to(torch.bfloat16).eval()


@pytest.mark.parametrize("method,draft_vocab_size", [("eagle", None), ("eagle", 20), ("eagle3", None),
                                                     ("mtp", None), ("medusa", None)])
def test_a_bfloat16_head_beside_a_float32_target_keeps_plain_greedy_output(tiny, method, draft_vocab_size):
    assert tiny.lm_head.weight.dtype == torch.float32
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 4, 9, 17, 30)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = run_engine(engine(tiny), prompts, params)
    head = bf16_head(tiny, method, draft_vocab_size)
    for name, knobs in SCHEDULES.items():
        prop = PROPOSERS[method](head, 3)
        eng = engine(tiny, prop, **knobs)
        assert run_engine(eng, prompts, params) == plain, f"{method}, {name}: output differs from plain decoding"
        assert eng.stats.num_draft_tokens > 0
        assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks, f"{method}, {name}: KV blocks leaked"
        if method != "medusa":  # Medusa keeps no cache; the others' caches are the head's dtype
            assert all(c.dtype == torch.bfloat16 for c in prop.cache)
    if draft_vocab_size:  # its rows of the target's LM head are copied in the head's dtype: half the bytes
        assert head.draft_head().head.weight.dtype == torch.bfloat16


def test_a_bfloat16_head_drafts_nearly_what_the_float32_head_drafts(tiny):
    """The knob takes effect (the logits are bfloat16's, not float32's bits) and changes little: the same
    head in both dtypes scores the same inputs within bfloat16's rounding."""
    torch.manual_seed(3)
    head32 = build_head(new_config("eagle", tiny, draft_vocab_size=20), tiny).eval()
    head32.d2t.copy_(torch.randperm(V)[:20].sort().values)
    head16 = bf16_head(tiny, "eagle", 20)
    head16.load_state_dict({k: v.to(torch.bfloat16) for k, v in head32.state_dict().items()})
    g = torch.randn(4, tiny.config.hidden_size)
    ids = torch.tensor([1, 2, 3, 4])
    with torch.inference_mode():
        head32.prepare()
        head16.prepare()
        x32, x16 = head32.inputs(ids, head32.features(g)), head16.inputs(ids, head16.features(g))
        l32, l16 = head32.logits(g), head16.logits(g)
    assert x16.dtype == torch.bfloat16 and l16.dtype == torch.float32
    torch.testing.assert_close(x16.float(), x32, rtol=0.05, atol=0.05)
    kept = head32.d2t
    assert not torch.equal(l16[:, kept], l32[:, kept])
    torch.testing.assert_close(l16[:, kept], l32[:, kept], rtol=0.05, atol=0.1)
    assert (l16.argmax(-1) == l32.argmax(-1)).float().mean() >= 0.75


@pytest.mark.parametrize("spec", [{"method": "eagle", "num_speculative_tokens": 3},
                                  {"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}],
                         ids=["eagle", "draft_model"])
def test_the_front_end_runs_the_drafter_in_draft_dtype(spec):
    prompts = ["def add(a, b):", "The quick brown fox"]
    params = SamplingParams(temperature=0, max_tokens=24)
    plain = [o.outputs[0].token_ids for o in LLM().generate(prompts, params)]
    llm = LLM(speculative_config={**spec, "draft_dtype": "bfloat16"})
    prop = llm.engine.runner.proposer
    drafter = prop.head if spec["method"] == "eagle" else prop.model
    assert next(drafter.parameters()).dtype == torch.bfloat16
    assert llm.engine.runner.model.lm_head.weight.dtype == torch.float32  # the target keeps its own
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == plain
    assert llm.engine.stats.num_accepted_tokens > 0
    sampled = llm.generate(prompts, SamplingParams(temperature=1.0, max_tokens=16, seed=7, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 16 for o in sampled)


def test_draft_dtype_is_checked_with_the_fix():
    assert SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2}).draft_dtype is None
    cfg = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2, "draft_dtype": "bfloat16"})
    assert cfg.draft_dtype == "bfloat16"
    with pytest.raises(ValueError, match=r"draft_dtype must be one of \('float32', 'bfloat16'\)"):
        SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 2, "draft_dtype": "int8"})
    for method in ("ngram", "suffix"):
        with pytest.raises(ValueError, match="has none"):
            SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 2, "draft_dtype": "bfloat16"})


def test_bench_heads_runs_every_model_drafter_once_per_draft_dtype():
    from speclab.bench.heads import rows_for

    one = rows_for(True, 4, 0.0, "smollm2-draft")
    two = rows_for(True, 4, 0.0, "smollm2-draft", draft_dtypes=["float32", "bfloat16"])
    model_rows = [r for r in one if r.method not in ("none", "ngram")]
    assert len(two) == len(one) + len(model_rows)
    assert [r.method for r in two if r.method in ("none", "ngram")] == ["none", "ngram"]
    for d in ("float32", "bfloat16"):
        rows = [r for r in two if r.draft_dtype == d]
        assert [(r.method, r.tree) for r in rows] == [(r.method, r.tree) for r in model_rows]
        assert all(r.spec["draft_dtype"] == d for r in rows)
