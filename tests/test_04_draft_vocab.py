"""A reduced draft vocabulary (FR-Spec, speclab/models/draft_vocab.py): cheaper drafts, the same output.

On tiny random Llamas over an 8-token vocabulary (as tests/test_06_spec_engine.py): a draft that
scores 5 of the 8 tokens drafts only those, its q is 0 elsewhere, greedy speculation still equals
plain decoding, and at temperature 1 the joint law of the first three tokens is still the target's
(chi2 over N = 8000 samples, p < 1e-4 fails). Negative control: the same drafts verified against the
draft's full-vocabulary q (the bug of forgetting that the drafts came from the reduced q) must fail.
"""

import json

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.models.draft_vocab import RANKING_FILE, ReducedLMHead, kept_tokens, load_ranking, scatter_to_vocab
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.tree_drafting import TreeShape
from speclab.sampling_params import SamplingParams
from speclab.spec_config import SpeculativeConfig
from speclab.train.draft_vocab import coverage, ranking_from_scores, soft_counts
from speclab.verify.tree import parse_tree, star_literal
from tests.helpers import run_engine
from tests.test_06_spec_engine import (N, PROMPT, SIGNIFICANCE, V, exact_joint, make_engine, pair,  # noqa: F401
                                       sample_joint)

KEPT = torch.tensor([0, 2, 3, 5, 6])  # 5 of the 8 tokens


def reduced_proposer(path, k, method="greedy", d2t=KEPT, tree=None):
    shape = TreeShape(static=parse_tree(tree)) if tree else None
    return DraftModelProposer(load_llama(path), k, num_kv_blocks=4096, block_size=4, sample_method=method, d2t=d2t,
                              tree=shape)


# --- the ranking and the kept tokens ------------------------------------------------------------

def test_ranking_puts_the_highest_scores_first_and_breaks_ties_by_id():
    scores = torch.tensor([0.5, 2.0, 0.0, 2.0, 0.0, 1.0])
    assert ranking_from_scores(scores).tolist() == [1, 3, 5, 0, 2, 4]


def test_coverage_is_the_share_of_mass_inside_the_first_n():
    ranking = torch.tensor([2, 0, 1, 3])
    mass = torch.tensor([0.2, 0.1, 0.6, 0.1])
    assert coverage(ranking, mass, sizes=(1, 2, 4)) == {1: 0.6, 2: 0.8, 4: 1.0}


def test_soft_counts_sum_the_targets_probabilities_over_answer_positions():
    class Fixed:  # logits of row t: t * e_(t mod 3) over 3 tokens
        def __call__(self, input_ids):
            T = input_ids.shape[1]
            logits = torch.zeros(1, T, 3)
            for t in range(T):
                logits[0, t, t % 3] = float(t)
            return type("Out", (), {"logits": logits})

    got = soft_counts(Fixed(), [[7, 7, 7, 7, 7]], [2])  # the answer is tokens 2..4: rows 1..3 predict them
    want = sum(torch.softmax(torch.eye(3, dtype=torch.float64)[t % 3] * t, 0) for t in (1, 2, 3))
    assert torch.allclose(got, want)


def test_kept_tokens_are_the_head_of_the_ranking_sorted_by_id():
    ranking = torch.tensor([5, 1, 7, 0, 2, 3, 4, 6])
    assert kept_tokens(ranking, 3).tolist() == [1, 5, 7]
    for bad in (0, 9, 2.5, True, None):
        with pytest.raises(ValueError, match="draft_vocab_size must be an integer in 1..8"):
            kept_tokens(ranking, bad)


def save_ranking(path, ranking) -> None:
    (path / RANKING_FILE).write_text(json.dumps({"ranking": [int(t) for t in ranking]}))


def test_a_missing_or_malformed_ranking_is_refused_with_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m speclab.train.draft_vocab"):
        load_ranking(tmp_path, 8)
    save_ranking(tmp_path, [0, 1, 1, 3, 4, 5, 6, 7])
    with pytest.raises(ValueError, match="permutation"):
        load_ranking(tmp_path, 8)
    (tmp_path / RANKING_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="not a token ranking"):
        load_ranking(tmp_path, 8)
    save_ranking(tmp_path, range(7, -1, -1))
    assert load_ranking(tmp_path, 8).tolist() == list(range(7, -1, -1))


def test_the_reduced_head_scores_the_kept_tokens_as_the_full_head_does(pair):
    _, target, _ = pair
    model = load_llama(target)
    hidden = torch.randn(5, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    full = model.compute_logits(hidden)
    got = ReducedLMHead(model.lm_head.weight, KEPT)(hidden)
    assert torch.allclose(got[:, KEPT], full[:, KEPT], atol=1e-5)
    assert torch.isneginf(got[:, [1, 4, 7]]).all()
    assert torch.equal(scatter_to_vocab(full[:, KEPT], KEPT, V)[:, KEPT], full[:, KEPT])


# --- the speculative config ----------------------------------------------------------------------

def test_draft_vocab_size_is_a_draft_models_key_and_a_positive_integer():
    ok = SpeculativeConfig.from_dict({"method": "draft_model", "model": "draft", "num_speculative_tokens": 2,
                                      "draft_vocab_size": 4})
    assert ok.draft_vocab_size == 4
    with pytest.raises(ValueError, match="draft model's key"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 2, "draft_vocab_size": 4})
    for bad in (0, -3, "8192", 1.5, True):
        with pytest.raises(ValueError, match="positive integer"):
            SpeculativeConfig.from_dict({"method": "draft_model", "model": "draft", "num_speculative_tokens": 2,
                                         "draft_vocab_size": bad})


def test_a_draft_without_a_ranking_is_refused_by_the_front_end():
    from speclab import LLM
    with pytest.raises(FileNotFoundError, match="token ranking beside the draft"):
        LLM(speculative_config={"method": "draft_model", "model": "draft", "num_speculative_tokens": 2,
                                "draft_vocab_size": 64})


def test_the_front_end_loads_the_ranking_shipped_beside_a_draft(tmp_path):
    import shutil
    from speclab import LLM
    from speclab.models.hub import model_directory
    shutil.copytree(model_directory("draft"), tmp_path / "d")
    vocab = json.loads((tmp_path / "d" / "config.json").read_text())["vocab_size"]
    ranking = torch.randperm(vocab, generator=torch.Generator().manual_seed(0))
    save_ranking(tmp_path / "d", ranking.tolist())
    llm = LLM(speculative_config={"method": "draft_model", "model": str(tmp_path / "d"), "num_speculative_tokens": 2,
                                  "draft_vocab_size": 100})
    assert llm.engine.runner.proposer.logits.d2t.tolist() == ranking[:100].sort().values.tolist()


# --- exactness in the engine ----------------------------------------------------------------------

@pytest.mark.parametrize("method, tree", [("greedy", None), ("probabilistic", None), ("greedy", star_literal(4))])
def test_greedy_speculation_with_a_reduced_vocabulary_equals_plain(pair, method, tree):
    """Chains, and the draft's star (its k most likely tokens, bench heads' tree for the draft model), whose
    children are the top-k of the reduced logits: only kept tokens are drafted, and the output is plain's."""
    _, target, draft = pair
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 4, 9, 17)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    prop = reduced_proposer(draft, 3 if tree is None else 4, method, tree=tree)
    drafted = []
    propose = prop.propose
    prop.propose = lambda *a, **kw: [drafted.extend(p.token_ids) or p for p in propose(*a, **kw)]
    plain = run_engine(make_engine(target), prompts, params)
    eng = make_engine(target, prop)
    assert run_engine(eng, prompts, params) == plain
    assert eng.stats.num_accepted_tokens > 0
    assert drafted and set(drafted) <= set(KEPT.tolist())  # only kept tokens are ever drafted


def test_a_tree_wider_than_the_draft_vocabulary_is_refused_with_the_fix(pair):
    _, _, draft = pair   # KEPT holds 5 tokens: a 6-star would draft a token of probability 0
    with pytest.raises(ValueError, match="scores only 5 tokens.*larger draft_vocab_size"):
        reduced_proposer(draft, 6, tree=star_literal(6))
    reduced_proposer(draft, 5, tree=star_literal(5))  # as wide as the vocabulary: fine


def test_sampled_drafts_come_from_the_reduced_q(pair):
    _, target, draft = pair
    prop = reduced_proposer(draft, 2, "probabilistic")
    eng = make_engine(target, prop)
    qs = []
    propose = prop.propose
    prop.propose = lambda *a, **kw: [qs.append(p.draft_probs) or p for p in propose(*a, **kw)]
    run_engine(eng, [PROMPT] * 20, SamplingParams(temperature=1.0, max_tokens=6, ignore_eos=True))
    q = torch.cat([x for x in qs if x is not None])
    assert q.shape[1] == V and torch.allclose(q.sum(-1), torch.ones(len(q), dtype=q.dtype))
    assert (q[:, [1, 4, 7]] == 0).all() and (q[:, KEPT] > 0).all()


@pytest.mark.slow  # chi2 over N = 8000 engine samples
@pytest.mark.parametrize("seeded", [False, True], ids=["leviathan-stream", "seeded-keyed"])
def test_sampled_outputs_with_a_reduced_vocabulary_follow_the_exact_target_law(pair, exact_joint, seeded):
    _, target, draft = pair
    eng = make_engine(target, reduced_proposer(draft, 2, "probabilistic"))
    counts = sample_joint(eng, N, seeded=seeded)
    pv = stats.chi2_gof(counts.ravel(), exact_joint.ravel().numpy())
    cells = int((exact_joint.ravel() * N >= 5).sum()) + 1
    assert pv > SIGNIFICANCE, (f"a reduced draft vocabulary changed the output law (p={pv:.1e}); this test detects "
                               f"TV >= {stats.min_detectable_tv(N, cells):.3f}")
    assert eng.stats.num_accepted_tokens > 0.2 * N


@pytest.mark.slow  # chi2 over N = 8000 engine samples
def test_negative_control_verifying_against_the_full_vocabulary_q_fails(pair, exact_joint):
    """Drafts drawn from the reduced q but verified against the full softmax: accept min(1, p/q) then
    uses the wrong q, and the output law moves. The test above must be able to see that."""
    _, target, draft = pair
    prop = reduced_proposer(draft, 2, "probabilistic")
    propose = prop.propose

    def wrong_q(*a, **kw):
        out = propose(*a, **kw)
        for p in out:
            if p.draft_probs is not None:  # weight on the tokens it never drafts, as the full softmax has
                reduced = p.draft_probs
                with_all = torch.where(reduced > 0, reduced, torch.full_like(reduced, 0.25))
                p.draft_probs = with_all / with_all.sum(-1, keepdim=True)
        return out
    prop.propose = wrong_q
    pv = stats.chi2_gof(sample_joint(make_engine(target, prop), N, seeded=False).ravel(), exact_joint.ravel().numpy())
    assert pv < SIGNIFICANCE, f"the law test cannot see drafts verified against the wrong q (p={pv:.2e})"


# --- the shipped SmolLM2 draft ----------------------------------------------------------------------

def test_the_shipped_ranking_is_a_permutation_with_its_record():
    from speclab.models import smollm2_draft
    path = smollm2_draft.SHIPPED
    if not (path / RANKING_FILE).is_file():
        pytest.fail(f"{path / RANKING_FILE} is not shipped: build it with `python -m speclab.train.draft_vocab`")
    config = json.loads((path / "config.json").read_text())
    ranking = load_ranking(path, config["vocab_size"])
    record = smollm2_draft.shipped_manifest()["token_ranking"]
    assert record["file"] == RANKING_FILE and record["data"]["train_answers"] > 0
    cov = record["heldout_coverage"]
    assert 0 < cov["8192"] <= cov["16384"] <= 1 and np.isfinite(list(cov.values())).all()
    assert ranking.numel() == config["vocab_size"]


def test_bench_heads_runs_the_smollm2_draft_over_the_reduced_vocabulary_too():
    from speclab.bench.heads import rows_for
    from speclab.models.smollm2_draft import DRAFT_VOCAB
    drafts = [r.spec for r in rows_for(True, 4, 0.0, "smollm2-draft") if r.method == "draft_model"]
    assert [(s.get("draft_vocab_size"), s.get("speculative_token_tree"), s.get("graft_method")) for s in drafts] == [
        (None, None, None), (DRAFT_VOCAB, None, None), (DRAFT_VOCAB, "[(0,), (1,), (2,), (3,)]", None),
        (DRAFT_VOCAB, "[(0,), (1,), (2,), (3,)]", "ngram")]  # chains, the 4-star, and the 4-star with a lookup grafted in
    assert all(r.spec is None or "draft_vocab_size" not in r.spec for r in rows_for(False, 4, 0.0, "draft"))
