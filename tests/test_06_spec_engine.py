"""Speculative decoding in the engine: greedy equality, exact sampling distribution, seeds, metrics.

Tiny random Llamas over an 8-token vocabulary (their output heads scaled up so that the
distributions are peaked, like a trained LM's) make the target's exact joint law over the first
three generated tokens computable: 512 sequences, scored by transformers' own forward.
"""

import numpy as np
import pytest
import torch
from transformers import LlamaConfig as HFLlamaConfig
from transformers import LlamaForCausalLM as HFLlama

from speclab import stats
from speclab.engine.llm_engine import LLMEngine
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.ngram import NgramProposer
from speclab.sampling import logits_to_probs
from speclab.sampling_params import SamplingParams
from speclab.verify import rejection_sample

V, L, PROMPT = 8, 3, [1, 2, 3, 1, 2]
SIGNIFICANCE = 1e-4


def tiny_llama(path, seed, head_scale, like=None, noise=0.0):
    """A tiny random Llama; with `like`, a copy of that model's weights plus relative Gaussian noise
    (a stand-in for a draft trained to imitate the target)."""
    torch.manual_seed(seed)
    hf = HFLlama(HFLlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)).eval()
    with torch.no_grad():
        if like is None:
            hf.lm_head.weight.mul_(head_scale)
        else:
            for p, ref in zip(hf.parameters(), like.parameters()):
                p.copy_(ref + noise * ref.std() * torch.randn_like(ref))
    hf.save_pretrained(path)
    return hf


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    hf = tiny_llama(root / "target", 0, 12.0)
    tiny_llama(root / "draft", 1, 12.0, like=hf, noise=0.5)
    return hf, root / "target", root / "draft"


def joint_law(hf, top_p=1.0):
    """P(x1, x2, x3 | PROMPT) at temperature 1 (and top-p), from transformers' forward: (V, V, V)."""
    seqs = torch.tensor([PROMPT + [a, b] for a in range(V) for b in range(V)])  # every 2-token continuation
    with torch.no_grad():
        probs = logits_to_probs(hf(seqs).logits.double(), top_p=top_p)  # (V*V, len + 2, V)
    n = len(PROMPT)
    p1 = probs[0, n - 1]  # (V,)
    p2 = probs[:, n].reshape(V, V, V)[:, 0]  # (V, V): x1 -> x2 (row a*V + b has x1 = a)
    p3 = probs[:, n + 1].reshape(V, V, V)  # (V, V, V): (x1, x2) -> x3
    return p1[:, None, None] * p2[:, :, None] * p3


@pytest.fixture(scope="module")
def exact_joint(pair):
    return joint_law(pair[0])


def make_engine(path, proposer=None, **kw):
    return LLMEngine(load_llama(path), **{"num_kv_blocks": 2048, "block_size": 4, "max_num_seqs": 4096,
                                           "max_num_batched_tokens": 1 << 16, "proposer": proposer, **kw})


def draft_proposer(path, k, method="greedy"):
    return DraftModelProposer(load_llama(path), k, num_kv_blocks=4096, block_size=4, sample_method=method)


def sample_joint(engine, n, seed0=0, temperature=1.0, top_p=1.0):
    """Counts of the first L generated tokens. Requests run to L + 2 tokens so that tokens 2..L come
    from verifications with the full k = 2 drafts (near max_tokens the engine drafts fewer)."""
    reqs = [engine.add_request(PROMPT, SamplingParams(temperature=temperature, top_p=top_p, max_tokens=L + 2,
                                                      seed=seed0 + i, ignore_eos=True)) for i in range(n)]
    while engine.has_unfinished():
        engine.step()
    counts = np.zeros((V,) * L)
    for r in reqs:
        counts[tuple(r.output_token_ids[:L])] += 1
    return counts


# ----------------------------------------------------------------------------------------------
# Greedy: speculative output is plain output, token for token


@pytest.mark.parametrize("proposer", ["ngram", "draft-greedy", "draft-probabilistic"])
@pytest.mark.parametrize("budget", [4096, 6])  # 6: chunked prefills and truncated drafts in ragged batches
def test_greedy_speculative_equals_plain(pair, proposer, budget):
    _, target, draft = pair
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 4, 9, 17)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    make = {"ngram": lambda: NgramProposer(1, 3, 4), "draft-greedy": lambda: draft_proposer(draft, 3),
            "draft-probabilistic": lambda: draft_proposer(draft, 3, "probabilistic")}[proposer]
    outs = []
    for prop in (None, make()):
        eng = make_engine(target, prop, max_num_batched_tokens=budget)
        reqs = [eng.add_request(p, params) for p in prompts]
        while eng.has_unfinished():
            eng.step()
        outs.append([r.output_token_ids for r in reqs])
        if prop is not None:
            assert eng.stats.num_draft_tokens > 0 and eng.stats.num_accepted_tokens > 0
            assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks  # every block came back
    assert outs[0] == outs[1]


def test_draft_equal_to_target_accepts_everything(pair):
    _, target, _ = pair
    eng = make_engine(target, draft_proposer(target, 4, "probabilistic"))
    sample_joint(eng, 50)
    m = eng.stats
    assert m.num_accepted_tokens == m.num_draft_tokens > 0


# ----------------------------------------------------------------------------------------------
# Sampling: the joint law of the first 3 tokens is the target's (N = 8000, chi2 p < 1e-4 fails)

N = 8000


def assert_exact(counts, joint, label):
    pv = stats.chi2_gof(counts.ravel(), joint.ravel().numpy())
    cells = int((joint.ravel() * N >= 5).sum()) + 1
    assert pv > SIGNIFICANCE, (f"{label}: engine samples differ from the target (p={pv:.1e}); this test "
                               f"detects TV >= {stats.min_detectable_tv(N, cells):.3f}")


@pytest.mark.parametrize("proposer", ["none", "ngram", "draft-greedy", "draft-probabilistic"])
def test_sampled_outputs_follow_the_exact_target_law(pair, exact_joint, proposer):
    _, target, draft = pair
    make = {"none": lambda: None, "ngram": lambda: NgramProposer(1, 2, 2),
            "draft-greedy": lambda: draft_proposer(draft, 2),
            "draft-probabilistic": lambda: draft_proposer(draft, 2, "probabilistic")}[proposer]
    eng = make_engine(target, make())
    counts = sample_joint(eng, N)
    assert_exact(counts, exact_joint, proposer)
    if proposer != "none":  # the speculative path did real work
        assert eng.stats.num_accepted_tokens > (0.02 if proposer == "ngram" else 0.2) * N


def test_top_p_outputs_follow_the_exact_top_p_law(pair):
    """top-p applied to target and draft alike: the output follows the target's nucleus law."""
    hf, target, draft = pair
    joint = joint_law(hf, top_p=0.8)
    assert (joint == 0).any()  # the nucleus really cuts tokens
    eng = make_engine(target, draft_proposer(draft, 2, "probabilistic"))
    assert_exact(sample_joint(eng, N, top_p=0.8), joint, "top_p=0.8")
    assert eng.stats.num_accepted_tokens > 0.2 * N


def test_speculative_and_direct_samples_agree_two_sample(pair):
    """The same claim without the exact law: speculative vs direct engine samples, two-sample chi2."""
    _, target, draft = pair
    direct = sample_joint(make_engine(target), N, seed0=10_000)
    spec = sample_joint(make_engine(target, draft_proposer(draft, 2, "probabilistic")), N, seed0=20_000)
    assert stats.chi2_two_sample(direct.ravel(), spec.ravel()) > SIGNIFICANCE


def test_negative_control_bonus_by_argmax_fails(pair, exact_joint):
    """A classic bug (seen in a public course repo): the bonus token taken as argmax p_{k+1}, not sampled."""
    _, target, draft = pair
    eng = make_engine(target, draft_proposer(draft, 2, "probabilistic"))

    def bonus_argmax(draft_ids, num, target_probs, draft_probs=None, **kw):
        out = rejection_sample(draft_ids, num, target_probs, draft_probs, **kw)
        k = torch.as_tensor(num)
        bonus_row = torch.cumsum(k + 1, 0) - 1
        all_accepted = (out >= 0).sum(1) == k + 1
        rows = torch.arange(len(k))[all_accepted]
        out[rows, k[all_accepted]] = target_probs[bonus_row[all_accepted]].argmax(-1)
        return out

    eng.runner.verifier = bonus_argmax
    counts = sample_joint(eng, N)
    pv = stats.chi2_gof(counts.ravel(), exact_joint.ravel().numpy())
    assert pv < SIGNIFICANCE, f"the distribution test cannot see a bonus token taken by argmax (p={pv:.2e})"


# ----------------------------------------------------------------------------------------------
# Seeds and metrics


@pytest.mark.parametrize("make", [lambda d: NgramProposer(1, 3, 3), lambda d: draft_proposer(d, 3, "probabilistic")])
def test_seeded_requests_reproduce_alone_and_in_a_batch(pair, make):
    _, target, draft = pair
    seeded = SamplingParams(temperature=1.0, top_p=0.95, max_tokens=20, seed=42, ignore_eos=True)
    other = SamplingParams(temperature=0.7, max_tokens=11, ignore_eos=True)
    eng = make_engine(target, make(draft))
    alone = eng.add_request(PROMPT, seeded)
    while eng.has_unfinished():
        eng.step()
    eng = make_engine(target, make(draft), seed=5)
    batch = [eng.add_request(p, s) for p, s in [([4, 4, 4], other), (PROMPT, seeded), ([7], other)]]
    while eng.has_unfinished():
        eng.step()
    assert batch[1].output_token_ids == alone.output_token_ids


def test_metrics_count_every_verification(pair):
    _, target, draft = pair
    eng = make_engine(target, draft_proposer(draft, 3))
    reqs = [eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))]
    steps = 0
    while eng.has_unfinished():
        eng.step()
        steps += 1
    m = eng.stats
    generated = len(reqs[0].output_token_ids)
    # every step emits 1 token plus its accepted drafts; every step but the prefill verifies drafts,
    # except a last one that had a single token left to generate (nothing to draft)
    assert generated == steps + m.num_accepted_tokens
    assert steps - 2 <= m.num_drafts <= steps - 1 and m.num_draft_tokens <= 3 * m.num_drafts
    assert m.num_accepted_tokens == sum(m.num_accepted_tokens_per_pos) > 0
    assert m.mean_acceptance_length == pytest.approx(1 + m.num_accepted_tokens / m.num_drafts)
