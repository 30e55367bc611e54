"""Speculative decoding in the engine: greedy equality, exact sampling distribution, seeds, metrics.

Tiny random Llamas over an 8-token vocabulary (their output heads scaled up so that the
distributions are peaked, like a trained LM's) make the target's exact joint law over the first
three generated tokens computable: 512 sequences, scored by transformers' own forward.
"""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.engine.llm_engine import LLMEngine
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.ngram import NgramProposer
from speclab.sampling import logits_to_probs
from speclab.sampling_params import SamplingParams
from speclab.verify import rejection_sample
from tests.helpers import run_engine

V, L, PROMPT = 8, 3, [1, 2, 3, 1, 2]
SIGNIFICANCE = 1e-4


@pytest.fixture(scope="module")
def pair(llama_pair):  # tests/conftest.py: the tiny target over V = 8 tokens and its draft
    return llama_pair


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


def sample_joint(engine, n, seed0=0, temperature=1.0, top_p=1.0, seeded=True):
    """Counts of the first L generated tokens. Requests run to L + 2 tokens so that tokens 2..L come
    from verifications with the full k = 2 drafts (near max_tokens the engine drafts fewer).
    seeded: each request has its own seed (position-keyed sampling, drafts checked against the
    target's samples); otherwise none has (Leviathan's rule on the engine's stream)."""
    params = [SamplingParams(temperature=temperature, top_p=top_p, max_tokens=L + 2,
                             seed=seed0 + i if seeded else None, ignore_eos=True) for i in range(n)]
    counts = np.zeros((V,) * L)
    for out in run_engine(engine, [PROMPT] * n, params):
        counts[tuple(out[:L])] += 1
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
        eng = make_engine(target, prop, max_num_batched_tokens=budget, max_num_seqs=min(budget, 4096))
        outs.append(run_engine(eng, prompts, params))
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


PROPOSERS = {"none": lambda d: None, "ngram": lambda d: NgramProposer(1, 2, 2),
             "draft-greedy": lambda d: draft_proposer(d, 2),
             "draft-probabilistic": lambda d: draft_proposer(d, 2, "probabilistic")}


@pytest.mark.slow  # chi2 over N = 8000 engine samples
@pytest.mark.parametrize("seeded", [False, True], ids=["leviathan-stream", "seeded-keyed"])
@pytest.mark.parametrize("proposer", list(PROPOSERS))
def test_sampled_outputs_follow_the_exact_target_law(pair, exact_joint, proposer, seeded):
    """Both sampling paths: unseeded requests (Leviathan's accept/residual on the engine's stream)
    and seeded ones (position-keyed samples, drafts checked against them)."""
    _, target, draft = pair
    eng = make_engine(target, PROPOSERS[proposer](draft))
    counts = sample_joint(eng, N, seeded=seeded)
    assert_exact(counts, exact_joint, proposer)
    if proposer != "none":  # the speculative path did real work
        assert eng.stats.num_accepted_tokens > (0.02 if proposer == "ngram" else 0.2) * N


@pytest.mark.slow  # chi2 over N = 8000 engine samples
@pytest.mark.parametrize("seeded", [False, True], ids=["leviathan-stream", "seeded-keyed"])
def test_top_p_outputs_follow_the_exact_top_p_law(pair, seeded):
    """top-p applied to target and draft alike: the output follows the target's nucleus law."""
    hf, target, draft = pair
    joint = joint_law(hf, top_p=0.8)
    assert (joint == 0).any()  # the nucleus really cuts tokens
    eng = make_engine(target, draft_proposer(draft, 2, "probabilistic"))
    assert_exact(sample_joint(eng, N, top_p=0.8, seeded=seeded), joint, "top_p=0.8")
    assert eng.stats.num_accepted_tokens > 0.2 * N


@pytest.mark.slow  # chi2 over N = 8000 engine samples
def test_speculative_and_direct_samples_agree_two_sample(pair):
    """The same claim without the exact law: speculative vs direct engine samples, two-sample chi2."""
    _, target, draft = pair
    direct = sample_joint(make_engine(target), N, seeded=False)
    spec = sample_joint(make_engine(target, draft_proposer(draft, 2, "probabilistic"), seed=1), N, seeded=False)
    assert stats.chi2_two_sample(direct.ravel(), spec.ravel()) > SIGNIFICANCE


def bonus_argmax(draft_ids, num, target_probs, draft_probs=None, **kw):
    """A classic bug (seen in a public course repo): the bonus token taken as argmax p_{k+1}, not sampled."""
    out = rejection_sample(draft_ids, num, target_probs, draft_probs, **kw)
    k = torch.as_tensor(num)
    bonus_row = torch.cumsum(k + 1, 0) - 1
    all_accepted = (out >= 0).sum(1) == k + 1
    rows = torch.arange(len(k))[all_accepted]
    out[rows, k[all_accepted]] = target_probs[bonus_row[all_accepted]].argmax(-1)
    return out


@pytest.mark.slow  # chi2 over N = 8000 engine samples
def test_negative_control_bonus_by_argmax_fails(pair, exact_joint):
    _, target, draft = pair
    eng = make_engine(target, draft_proposer(draft, 2, "probabilistic"))
    eng.runner.verifier = bonus_argmax
    pv = stats.chi2_gof(sample_joint(eng, N, seeded=False).ravel(), exact_joint.ravel().numpy())
    assert pv < SIGNIFICANCE, f"the distribution test cannot see a bonus token taken by argmax (p={pv:.2e})"


@pytest.mark.slow  # chi2 over N = 8000 engine samples
def test_negative_control_one_key_per_step_fails(pair, exact_joint, monkeypatch):
    """The seeded path's classic bug: keying the noise by the step (its first position) instead of
    by each token's position, so all k + 1 samples of a verification share one noise row."""
    import speclab.engine.model_runner as runner_module
    from speclab.sampling import keyed_sample

    _, target, draft = pair
    monkeypatch.setattr(runner_module, "keyed_sample",
                        lambda probs, seed, positions: keyed_sample(probs, seed, [positions[0]] * len(positions)))
    eng = make_engine(target, draft_proposer(draft, 2, "probabilistic"))
    pv = stats.chi2_gof(sample_joint(eng, N, seeded=True).ravel(), exact_joint.ravel().numpy())
    assert pv < SIGNIFICANCE, f"the distribution test cannot see noise shared across a step's positions (p={pv:.2e})"


# ----------------------------------------------------------------------------------------------
# Seeds: the same seed gives the same output alone, in any batch, preempted, with drafts truncated

SEED_PROPOSERS = {"none": lambda d: None, "ngram": lambda d: NgramProposer(1, 3, 3),
                  "draft-greedy": lambda d: draft_proposer(d, 3),
                  "draft-probabilistic": lambda d: draft_proposer(d, 3, "probabilistic")}


@pytest.mark.parametrize("proposer", list(SEED_PROPOSERS))
def test_seeded_requests_reproduce_alone_batched_preempted_and_truncated(pair, proposer):
    """Adversarial schedules: a batch of other requests (seeded and not), a pool so small that
    requests are preempted and recomputed, and a token budget that truncates drafts. Before
    position-keyed sampling, up to 27 of 43 seeded requests changed under such schedules."""
    _, target, draft = pair
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (2, 5, 9, 3, 7, 4)]
    seeded = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=40 + i, ignore_eos=True)
              for i in range(len(prompts))]
    alone = [run_engine(make_engine(target, SEED_PROPOSERS[proposer](draft)), [p], sp)[0]
             for p, sp in zip(prompts, seeded)]
    other = SamplingParams(temperature=0.8, max_tokens=17, ignore_eos=True)
    mixed_prompts = [x for p in prompts for x in (p, [1, 1, 2])]
    mixed_params = [x for sp in seeded for x in (sp, other)]
    schedules = {"batch": dict(seed=5), "tiny pool": dict(num_kv_blocks=24, seed=6),
                 "budget truncates drafts": dict(max_num_batched_tokens=6, max_num_seqs=5, seed=7)}
    for name, knobs in schedules.items():
        eng = make_engine(target, SEED_PROPOSERS[proposer](draft), **knobs)
        outs = run_engine(eng, mixed_prompts, mixed_params)[::2]
        changed = [i for i, (a, b) in enumerate(zip(outs, alone)) if a != b]
        assert not changed, f"{name}: seeded requests {changed} changed (vs alone) with {proposer} drafts"
        if name == "tiny pool":
            assert eng.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
        assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks


def test_seeded_output_does_not_depend_on_the_drafter(pair):
    """Drafter invariance: with a seed, what is drafted changes speed, never the tokens."""
    _, target, draft = pair
    params = SamplingParams(temperature=1.0, max_tokens=24, seed=9, ignore_eos=True)
    outs = [run_engine(make_engine(target, make(draft)), [PROMPT, [3, 1]], params)
            for make in SEED_PROPOSERS.values()]
    assert all(o == outs[0] for o in outs)


def test_metrics_count_every_verification(pair):
    _, target, draft = pair
    eng = make_engine(target, draft_proposer(draft, 3))
    reqs = [eng.add_request(PROMPT, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))]
    steps = 0
    while eng.has_unfinished():  # stepped by hand: the test counts steps
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
