"""Sampled drafting with heads is exact: the joint law of the first tokens is the target's.

As tests/test_06_spec_engine.py does for draft models: a tiny random target over 8 tokens (output
head scaled up: peaked, like a trained LM's) whose exact law over the first 3 generated tokens is
computable, an EAGLE head (random, bound to it) drafting probabilistically with q kept, N = 8000
engine samples, chi2 at p < 1e-4. The negative control keeps q but drafts the argmax of q (a
drafter that lies about how it drew its tokens): the same test must reject it.
"""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.engine.llm_engine import LLMEngine
from speclab.models.heads import build_head, new_config
from speclab.models.llama import load_llama
from speclab.proposers.eagle import EagleProposer
from speclab.proposers.medusa import MedusaProposer
from speclab.sampling import logits_to_probs
from speclab.sampling_params import SamplingParams
from tests.helpers import run_engine, tiny_llama
from tests.test_06_spec_engine import L, PROMPT, SIGNIFICANCE, V, joint_law

N = 8000
pytestmark = pytest.mark.slow  # chi2 over N = 8000 engine samples each


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = tmp_path_factory.mktemp("law")
    hf = tiny_llama(path, vocab_size=V, seed=0, head_scale=12.0)
    return hf, load_llama(path)


def head(model, method):
    torch.manual_seed(5)
    h = build_head(new_config(method, model, num_heads=2 if method == "medusa" else 0), model).eval()
    with torch.no_grad():
        for name, p in h.named_parameters():
            if "linear.weight" in name:
                p.normal_(0, 0.3)
    return h


def sample_joint(model, proposer, top_p=1.0, seeded=False):
    eng = LLMEngine(model, num_kv_blocks=4096, block_size=4, max_num_seqs=4096, max_num_batched_tokens=1 << 16,
                    proposer=proposer)
    params = [SamplingParams(temperature=1.0, top_p=top_p, max_tokens=L + 2, seed=i if seeded else None,
                             ignore_eos=True) for i in range(N)]
    counts = np.zeros((V,) * L)
    for out in run_engine(eng, [PROMPT] * N, params):
        counts[tuple(out[:L])] += 1
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks
    return counts, eng.stats


def p_value(counts, joint):
    return stats.chi2_gof(counts.ravel(), joint.ravel().numpy())


def detectable(joint):
    return stats.min_detectable_tv(N, int((joint.ravel() * N >= 5).sum()) + 1)


@pytest.mark.parametrize("method,top_p,seeded", [("eagle", 1.0, False), ("eagle", 1.0, True), ("eagle", 0.8, False),
                                                 ("medusa", 1.0, False)],
                         ids=["eagle-T1", "eagle-T1-seeded", "eagle-top_p0.8", "medusa-T1"])
def test_sampled_head_drafts_keep_the_target_law(target, method, top_p, seeded):
    hf, model = target
    joint = joint_law(hf, top_p=top_p)
    prop = (MedusaProposer if method == "medusa" else EagleProposer)(head(model, method), 2, "probabilistic")
    counts, m = sample_joint(model, prop, top_p, seeded)
    pv = p_value(counts, joint)
    assert pv > SIGNIFICANCE, (f"{method} drafts (top_p={top_p}, seeded={seeded}) change the output law "
                               f"(p={pv:.1e}); this test detects TV >= {detectable(joint):.3f}")
    assert m.num_accepted_tokens > 0.1 * N, "the speculative path did too little to be tested"


def test_negative_control_argmax_drafts_with_q_kept_fail(target, monkeypatch):
    """Drafting the argmax of q while reporting q: the rejection rule's min(1, p/q) then assumes a
    draw from q that never happened, and the output law moves off the target's."""
    import speclab.proposers.eagle as eagle_module

    def lying(requests, logits, positions, sample_method, generator):
        qs = [logits_to_probs(row, r.params.temperature, r.params.top_k, r.params.top_p) for r, row in zip(requests, logits)]
        return logits.argmax(-1).tolist(), qs

    hf, model = target
    monkeypatch.setattr(eagle_module, "draft_tokens", lying)
    counts, _ = sample_joint(model, EagleProposer(head(model, "eagle"), 2, "probabilistic"))
    pv = p_value(counts, joint_law(hf))
    assert pv < SIGNIFICANCE, f"the law test cannot see argmax drafts passed off as samples from q (p={pv:.1e})"
