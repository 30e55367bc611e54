"""Lesson 10: draft trees. The tree literal and its checks, the ancestor mask, the exact sibling rules
(with their classic bugs as mutants that must fail), and trees in the engine: greedy output equal to
plain greedy with preemption, static and dynamic, draft model and EAGLE; the sampled law equal to
the target's (chi-squared, with broken trees as negative controls); counters by depth; the server.

Statistical tests fail at p < 1e-4 and state the smallest total-variation distance they detect
with power 0.99 (`stats.min_detectable_tv`).
"""

import json

import numpy as np
import pytest
import torch

from helpers import engine_law_p_value, outputs_and_counters, run_engine
from mutants import (drawn_siblings_verified_as_iid, on_support_forgetting_the_rest, q_without_temperature,
                     sample_tree_without_removal)
from speclab import LLM, SamplingParams, stats
from speclab.engine.llm_engine import LLMEngine
from speclab.engine.model_runner import ModelRunner
from speclab.metrics import spec_decode_counters
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.tree_drafting import TreeShape
from speclab.spec_config import SpeculativeConfig
from speclab.toy import MarkovLM
from speclab.verify import tree as vtree
from speclab.verify.tree import (TokenTree, chain, from_parents, parse_tree, recursive_rejection_sample, sample_tree,
                                 star_literal)

SIGNIFICANCE = 1e-4
TREE6 = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"  # vLLM's docs' example


# ----------------------------------------------------------------------------------------------
# The literal


def test_a_star_is_k_children_of_the_root():
    star = parse_tree(star_literal(3))
    assert star.num_nodes == 3 and star.children[0] == (1, 2, 3) and star.paths() == [(0,), (1,), (2,)]
    assert star.max_depth == 1 and parse_tree(star_literal(1)).paths() == chain(1).paths()


def test_parse_sorts_breadth_first_and_round_trips():
    t = parse_tree("[(0, 0, 0), (1, 0), (0,), (0, 1), (1,), (0, 0)]")  # any order in, breadth first out
    assert t.paths() == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert t.parents == (-1, 0, 0, 1, 1, 2, 3) and t.depths == (0, 1, 1, 2, 2, 2, 3)
    assert t.children[0] == (1, 2) and t.children[1] == (3, 4) and t.num_nodes == 6 and t.max_depth == 3
    assert parse_tree(TREE6) == parse_tree(json.loads(json.dumps(eval(TREE6))))  # a list of lists works too
    assert parse_tree("[(0,), (0, 0), (0, 0, 0)]") == chain(3)
    assert t.truncate(3).paths() == [(0,), (1,), (0, 0)] and t.up_to_depth(1).num_nodes == 2
    assert from_parents(t.parents, t.ranks) == t


@pytest.mark.parametrize("literal, match", [
    ("[(0,), (0, 1, 0)]", r"no parent \(0, 1\)"),
    ("[(1, 0)]", r"no parent \(1,\)"),
    ("[(0,), (0,)]", "appears twice"),
    ("[(0,), (-1,)]", "ranks >= 0"),
    ("[()]", "non-empty tuple"),
    ("[]", "non-empty list"),
    ("[(0,), (0,0)", "not a Python literal"),
    ("chain", "not a Python literal"),
])
def test_invalid_trees_are_refused_with_the_fix(literal, match):
    with pytest.raises(ValueError, match=match):
        parse_tree(literal)


def test_more_nodes_than_slots_is_refused():
    with pytest.raises(ValueError, match="at most 5"):
        parse_tree(TREE6, max_nodes=5)
    with pytest.raises(ValueError, match="must precede"):
        from_parents([-1, 0, 3, 1])


def test_ancestor_mask_siblings_never_see_each_other():
    t = parse_tree(TREE6)
    m = t.attention_mask()
    for i in range(t.num_nodes + 1):
        assert set(m[i].nonzero().flatten().tolist()) == set(t.ancestors(i))
    assert not m[1, 2] and not m[2, 1] and not m[3, 4] and m[6, 3] and m[6, 1] and not m[6, 2]


# ----------------------------------------------------------------------------------------------
# The sibling rules, by themselves


def loop_counts_tree(verify, target: MarkovLM, draft: MarkovLM, tree: TokenTree, L: int, n: int, g) -> np.ndarray:
    """Joint counts of the first L tokens of n speculative loops, each step a tree of the draft's top-k
    children (deterministic) verified by `verify(tree, tokens, probs, generator)`."""
    V = target.vocab_size
    counts = np.zeros(V ** L, dtype=np.int64)
    order = draft.transition.argsort(-1, descending=True)  # the draft's top-k at each last token
    for _ in range(n):
        seq, last = [], 0
        while len(seq) < L:
            node_tok = [last]
            for i in range(1, tree.num_nodes + 1):
                node_tok.append(int(order[node_tok[tree.parents[i]], tree.ranks[i]]))
            probs = target.transition[torch.tensor(node_tok)]  # (N + 1, V): a Markov target
            _, out = verify(tree, node_tok[1:], probs, g)
            seq += out
            last = seq[-1]
        counts[sum(t * V ** (L - 1 - j) for j, t in enumerate(seq[:L]))] += 1
    return counts


@pytest.mark.parametrize("verify, exact", [(sample_tree, True), (sample_tree_without_removal, False)])
def test_tree_loop_law(verify, exact):
    """V = 3, the first 3 tokens of n = 4000 loops over a 5-node tree (27 cells: detects TV >= ~0.09)."""
    g = torch.Generator().manual_seed(5)
    target = MarkovLM.random(3, g, spread=1.5)
    draft = target.blend(MarkovLM.random(3, g, spread=2.0), 0.6)
    tree = parse_tree("[(0,), (1,), (0, 0), (1, 0), (0, 0, 0)]")
    L, n = 3, 4000
    counts = loop_counts_tree(verify, target, draft, tree, L, n, g)
    pv = stats.chi2_gof(counts, target.joint([0], L).ravel().numpy())
    tv = stats.min_detectable_tv(n, 27)
    if exact:
        assert pv > SIGNIFICANCE, f"the tree rule's loop law differs from the target's (p={pv:.1e}, detects TV >= {tv:.3f})"
    else:
        assert pv < SIGNIFICANCE, f"the mutant passed (p={pv:.2f}): the test cannot see the bug"


def loop_counts_drawn_tree(target: MarkovLM, draft: MarkovLM, tree: TokenTree, L: int, n: int, g) -> np.ndarray:
    """As `loop_counts_tree`, each node's children drawn from the draft's q there without replacement and
    verified by `sample_tree_drawn` (the draft_sample_method "probabilistic" tree)."""
    V = target.vocab_size
    counts = np.zeros(V ** L, dtype=np.int64)
    for _ in range(n):
        seq, last = [], 0
        while len(seq) < L:
            node_tok = [last]
            for p in range(tree.num_nodes + 1):  # breadth first: a parent's token is known before its children
                kids = tree.children[p]
                if kids:
                    drawn = vtree.draw_children(draft.transition[node_tok[p]], len(kids), replacement=False, generator=g)
                    node_tok += drawn
            probs = target.transition[torch.tensor(node_tok)]
            q = draft.transition[torch.tensor([node_tok[tree.parents[i]] for i in range(1, tree.num_nodes + 1)])]
            _, out = vtree.sample_tree_drawn(tree, node_tok[1:], probs, q, g)
            seq += out
            last = seq[-1]
        counts[sum(t * V ** (L - 1 - j) for j, t in enumerate(seq[:L]))] += 1
    return counts


@pytest.mark.parametrize("exact", [True, False])
def test_drawn_tree_loop_law(exact, monkeypatch):
    """V = 3, the first 3 tokens of n = 3000 loops over a tree whose children are drawn from q without replacement
    (27 cells: detects TV >= ~0.1); verified with the i.i.d. update (q never reduced), the law must break."""
    if not exact:
        monkeypatch.setattr("speclab.verify.tree.recursive_rejection_sample", drawn_siblings_verified_as_iid)
    g = torch.Generator().manual_seed(3)
    target = MarkovLM.random(3, g, spread=1.5)
    draft = MarkovLM.random(3, g, spread=2.0)
    tree = parse_tree("[(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)]")
    L, n = 3, 3000
    pv = stats.chi2_gof(loop_counts_drawn_tree(target, draft, tree, L, n, g), target.joint([0], L).ravel().numpy())
    if exact:
        assert pv > SIGNIFICANCE, f"the drawn tree's loop law differs from the target's (p={pv:.1e})"
    else:
        assert pv < SIGNIFICANCE, f"the i.i.d.-update mutant passed (p={pv:.2f}): the test cannot see the bug"


@pytest.mark.parametrize("exact", [True, False])
def test_drawn_children_from_a_draft_vocabulary_keep_the_law(exact, monkeypatch):
    """A q over 3 of 6 tokens (a draft vocabulary), 2 children drawn from it without replacement, verified by
    `sample_tree_drawn`, which works over q's support and lumps the other tokens into one outcome: n = 4000
    emitted tokens against p (6 cells: detects TV >= ~0.06). Forgetting the lumped mass must fail."""
    if not exact:
        monkeypatch.setattr("speclab.verify.tree._on_support", on_support_forgetting_the_rest)
    g = torch.Generator().manual_seed(2)
    p = torch.tensor([0.30, 0.05, 0.20, 0.25, 0.12, 0.08])
    q = torch.tensor([0.10, 0.60, 0.30, 0.0, 0.0, 0.0])
    star = parse_tree("[(0,), (1,)]")
    n, counts = 4000, np.zeros(6)
    for _ in range(n):
        drafts = vtree.draw_children(q, 2, replacement=False, generator=g)
        _, out = vtree.sample_tree_drawn(star, drafts, p[None].expand(3, 6), q[None].expand(2, 6), g)
        counts[out[0]] += 1
    pv = stats.chi2_gof(counts, p.double().numpy())
    if exact:
        assert pv > SIGNIFICANCE, f"p={pv:.1e} (detects TV >= {stats.min_detectable_tv(n, 6):.3f})"
    else:
        assert pv < SIGNIFICANCE, f"the mutant that forgets the lumped mass passed (p={pv:.2f})"


@pytest.mark.parametrize("vocab", [None, [0, 2, 3, 5]])
@pytest.mark.parametrize("exact", [True, False])
def test_drawn_siblings_follow_successive_sampling_from_q(vocab, exact, monkeypatch):
    """`draw_siblings` (a sampled request's children, T = 0.6) over the whole vocabulary and over a draft
    vocabulary (logits -inf elsewhere): two distinct children, q a (V,) row with no mass off the vocabulary,
    and the ordered pair drawn with P(a, b) = q(a) q(b) / (1 - q(a)): n = 4000 pairs (12 or 30 cells: detects
    TV >= ~0.07; exact p 0.055-0.98 over five seeds, the mutant below 1e-200).
    A q that skips the temperature must fail."""
    from speclab.proposers.tree_drafting import draw_siblings
    from speclab.sampling import logits_to_probs
    if not exact:
        monkeypatch.setattr("speclab.proposers.tree_drafting.logits_to_probs", q_without_temperature)
    g = torch.Generator().manual_seed(4)
    V = 6
    logits = torch.tensor([1.2, -0.3, 0.4, 2.0, -1.0, 0.9])
    if vocab is not None:
        logits[[t for t in range(V) if t not in vocab]] = float("-inf")
    want_q = logits_to_probs(logits, 0.6, 0, 1.0).double()
    draw = draw_siblings(SamplingParams(temperature=0.6), g, None if vocab is None else torch.tensor(vocab))
    n, counts = 4000, np.zeros((V, V))
    for _ in range(n):
        (a, b), q = draw(logits, 2)
        assert a != b and q.shape == (V,)
        counts[a, b] += 1
    if exact:
        torch.testing.assert_close(q.double(), want_q, rtol=1e-6, atol=1e-7)
    cells = [(a, b) for a in range(V) for b in range(V) if a != b and want_q[a] > 0 and want_q[b] > 0]
    expected = np.array([float(want_q[a] * want_q[b] / (1 - want_q[a])) for a, b in cells])
    pv = stats.chi2_gof(np.array([counts[c] for c in cells]), expected / expected.sum())
    if exact:
        assert pv > SIGNIFICANCE, f"p={pv:.1e} (detects TV >= {stats.min_detectable_tv(n, len(cells)):.3f})"
    else:
        assert pv < SIGNIFICANCE, f"the q-without-temperature mutant passed (p={pv:.2f})"


@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (2, 1.0), (0, 0.7), (3, 0.5), (10, 0.9)])
def test_drawn_siblings_over_a_vocabulary_process_q_as_the_whole_row(top_k, top_p):
    """Over a draft vocabulary, q is the request's processing (temperature, top-k, top-p) of the whole row, whose
    other tokens have probability 0; the children are distinct tokens q gives mass to, or past q's support the
    vocabulary's next best (never tested by the verifier)."""
    from speclab.proposers.tree_drafting import draw_siblings
    from speclab.sampling import logits_to_probs
    g = torch.Generator().manual_seed(7)
    vocab = torch.tensor([1, 4, 5, 8, 9])
    logits = torch.full((12,), float("-inf"))
    logits[vocab] = torch.tensor([0.3, 2.1, -0.4, 1.0, 0.8])
    params = SamplingParams(temperature=0.9, top_k=top_k, top_p=top_p)
    want = logits_to_probs(logits, 0.9, top_k, top_p)
    draw = draw_siblings(params, g, vocab)
    for _ in range(50):
        tokens, q = draw(logits, 3)
        torch.testing.assert_close(q, want, rtol=1e-6, atol=1e-7)
        assert len(set(tokens)) == 3 and set(tokens) <= set(vocab.tolist())
        support = int((want > 0).sum())
        assert all(want[t] > 0 for t in tokens[:support])


def test_tree_walk_is_greedy_and_keeps_the_matching_branch():
    t = parse_tree(TREE6)
    # nodes: 1:(0,)=5 2:(1,)=7 3:(0,0)=2 4:(0,1)=9 5:(1,0)=4 6:(0,0,0)=1
    tokens = [5, 7, 2, 9, 4, 1]
    targets = [7, 0, 4, 0, 0, 3, 0]  # the target wants 7 at the root, then 4 after 7, then 3 after 4
    assert vtree.walk(t, tokens, targets) == ([2, 5], [7, 4, 3])
    assert vtree.walk(t, tokens, [8] * 7) == ([], [8])


def single_node_counts(p, q, m, n, g, *, replacement, verify_without_replacement):
    counts, accepted = np.zeros(len(p), dtype=np.int64), 0
    for _ in range(n):
        drafts = vtree.draw_children(q, m, replacement=replacement, generator=g)
        i, x = recursive_rejection_sample(p, drafts, q, without_replacement=verify_without_replacement, generator=g)
        counts[x] += 1
        accepted += i >= 0
    return counts, accepted / n


@pytest.mark.parametrize("replacement, verify_without, exact", [
    (False, True, True),   # Jeon et al.'s recursive rejection sampling
    (True, False, True),   # SpecInfer's MSS for i.i.d. siblings
    (True, True, False),   # MUTANT: i.i.d. siblings verified as if drawn without replacement
    (False, False, False),  # MUTANT: siblings without replacement, residual with the original q
])
def test_multi_draft_rules_and_the_classic_bug(replacement, verify_without, exact):
    """V = 6, m = 3 siblings, n = 4000 draws (6 cells: detects TV >= ~0.06; the mutants are off by 0.1-0.3)."""
    g = torch.Generator().manual_seed(1)
    p = torch.tensor([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], dtype=torch.float64)
    q = torch.tensor([0.05, 0.08, 0.12, 0.20, 0.25, 0.30], dtype=torch.float64)
    n = 4000
    counts, rate = single_node_counts(p, q, 3, n, g, replacement=replacement, verify_without_replacement=verify_without)
    pv = stats.chi2_gof(counts, p.numpy())
    if exact:
        assert pv > SIGNIFICANCE, f"p={pv:.1e} (detects TV >= {stats.min_detectable_tv(n, 6):.3f}); acceptance {rate:.2f}"
    else:
        assert pv < SIGNIFICANCE, f"the mutant passed (p={pv:.2f}, acceptance {rate:.2f})"


def test_sample_tree_with_p_one_hot_is_the_walk():
    t = parse_tree(TREE6)
    probs = torch.nn.functional.one_hot(torch.tensor([7, 0, 4, 0, 0, 3, 0]), 10).double()
    assert sample_tree(t, [5, 7, 2, 9, 4, 1], probs, torch.Generator().manual_seed(0)) == ([2, 5], [7, 4, 3])


# ----------------------------------------------------------------------------------------------
# The config


def test_config_checks_tree_keys():
    ok = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 6, "speculative_token_tree": TREE6})
    assert TreeShape.from_config(ok).num_nodes == 6
    dyn = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 7, "speculative_num_steps": 3,
                                       "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 8})
    assert TreeShape.from_config(dyn).max_run == 4
    drawn = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 6, "speculative_token_tree": TREE6,
                                         "draft_sample_method": "probabilistic"})  # children drawn from q
    assert TreeShape.from_config(drawn).static.num_nodes == 6
    base = {"method": "draft_model", "model": "draft"}
    bad = [
        ({"num_speculative_tokens": 4, "speculative_token_tree": TREE6}, "must be equal"),
        ({"num_speculative_tokens": 6, "speculative_token_tree": "[(0,), (0, 1, 1)]"}, "no parent"),
        ({"num_speculative_tokens": 7, "speculative_eagle_topk": 2}, "all three"),
        ({"num_speculative_tokens": 3, "speculative_num_steps": 3, "speculative_eagle_topk": 2,
          "speculative_num_draft_tokens": 8}, "must be 7"),
        ({"num_speculative_tokens": 6, "speculative_token_tree": TREE6, "rejection_sample_method": "block"}, "standard"),
        ({"num_speculative_tokens": 3, "speculative_num_steps": 2, "speculative_eagle_topk": 2,
          "speculative_num_draft_tokens": 4, "draft_sample_method": "probabilistic"}, "greedy"),
        ({"num_speculative_tokens": 6, "speculative_token_tree": TREE6, "speculative_eagle_topk": 2}, "not both"),
    ]
    for extra, match in bad:
        with pytest.raises(ValueError, match=match):
            SpeculativeConfig.from_dict({**base, **extra})
    with pytest.raises(ValueError, match="model drafters"):
        SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 6, "speculative_token_tree": TREE6})


# ----------------------------------------------------------------------------------------------
# In the engine: the embedded pair (greedy), and tiny random Llamas over 8 tokens (the law)

PROMPTS = ["def fibonacci(n):", "the cat sat on the", "1 2 3 4 5 6", "for i in range(10):", "hello world"]
SPECS = {
    "draft static": {"method": "draft_model", "model": "draft", "num_speculative_tokens": 6, "speculative_token_tree": TREE6},
    "draft dynamic": {"method": "draft_model", "model": "draft", "num_speculative_tokens": 7, "speculative_num_steps": 3,
                      "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 8},
    "eagle static": {"method": "eagle", "num_speculative_tokens": 6, "speculative_token_tree": TREE6},
    "eagle dynamic": {"method": "eagle", "num_speculative_tokens": 7, "speculative_num_steps": 3,
                      "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 8},
}
GREEDY = SamplingParams(temperature=0, max_tokens=32)


@pytest.fixture(scope="module")
def plain_greedy():
    return [o.outputs[0].token_ids for o in LLM().generate(PROMPTS, GREEDY, use_tqdm=False)]


def tree_counters(spec, **kw):
    return outputs_and_counters(spec, PROMPTS, GREEDY, **kw)


@pytest.mark.parametrize("name", [n if n == "draft static" else pytest.param(n, marks=pytest.mark.slow) for n in SPECS])
def test_engine_greedy_tree_is_plain_greedy_with_preemption(name, plain_greedy):
    out, c, llm = tree_counters(SPECS[name])
    assert out == plain_greedy, name
    assert 0 < c["num_accepted_tokens"] <= c["num_draft_tokens"]
    depth = TreeShape.from_config(SpeculativeConfig.from_dict(SPECS[name]))
    per_pos = c["num_accepted_tokens_per_pos"]
    max_depth = depth.static.max_depth if depth.static else depth.num_steps
    assert all(n == 0 for n in per_pos[max_depth:]) and per_pos == sorted(per_pos, reverse=True), per_pos
    assert sum(per_pos) == c["num_accepted_tokens"]
    small, _, small_llm = tree_counters(SPECS[name], num_kv_blocks=16, block_size=4, max_num_batched_tokens=20,
                                     max_num_seqs=4)
    assert small == plain_greedy, f"{name} with preemption and a small token budget"
    assert small_llm.engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"


@pytest.mark.slow
def test_a_chain_written_as_a_tree_is_the_chain():
    chain_spec = {"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}
    _, c_chain, _ = tree_counters(chain_spec)
    _, c_tree, _ = tree_counters({**chain_spec, "speculative_token_tree": "[(0,), (0, 0), (0, 0, 0)]"})
    assert c_tree == c_chain


def test_a_tree_accepts_more_than_its_main_branch():
    """Greedy, so deterministic: the tree holds its rank-0 chain, and more."""
    _, c_chain, _ = tree_counters({"method": "draft_model", "model": "draft", "num_speculative_tokens": 3})
    _, c_tree, _ = tree_counters(SPECS["draft static"])
    print(f"mean acceptance length: chain {c_chain['mean_acceptance_length']:.3f}, tree "
          f"{c_tree['mean_acceptance_length']:.3f}")
    assert c_tree["mean_acceptance_length"] > c_chain["mean_acceptance_length"]


@pytest.mark.parametrize("broken", ["no compaction", "siblings see each other"])
def test_broken_trees_break_greedy(broken, plain_greedy, monkeypatch):
    """Negative controls: the greedy-equality test sees a missing KV compaction and a leaky mask."""
    if broken == "no compaction":
        monkeypatch.setattr(ModelRunner, "_compact", lambda self, s, path: None)
    else:
        monkeypatch.setattr(TokenTree, "attention_mask",
                            lambda self: torch.ones(self.num_nodes + 1, self.num_nodes + 1, dtype=torch.bool).tril())
    out, _, _ = tree_counters(SPECS["draft static"])
    assert out != plain_greedy, f"{broken}: the test did not see it"


EV, EPROMPT = 8, [1, 2, 3, 1, 2]


def tree_engine(target, draft, tree=TREE6, sample_method="greedy"):
    shape = TreeShape(static=parse_tree(tree))
    proposer = DraftModelProposer(load_llama(draft), shape.num_nodes, num_kv_blocks=8192, block_size=4, tree=shape,
                                  sample_method=sample_method)
    return LLMEngine(load_llama(target), proposer=proposer, num_kv_blocks=8192, block_size=4, max_num_seqs=2048,
                     max_num_batched_tokens=1 << 15)


@pytest.mark.slow  # 2 x 3000 requests through the engine (about 30 s each under load)
@pytest.mark.parametrize("broken", [None, "siblings tested against the original p"])
def test_engine_tree_samples_follow_the_target(broken, llama_pair, monkeypatch):
    """T = 1, unseeded (the engine's stream and `sample_tree` decide): the first 3 tokens of n = 3000
    requests against the exact joint law from transformers (detects TV >= ~0.1 over the cells with
    enough mass); the engine with the sibling-rule mutant must fail."""
    hf, target, draft = llama_pair
    if broken:
        monkeypatch.setattr("speclab.engine.model_runner.sample_tree", sample_tree_without_removal)
    eng = tree_engine(target, draft)
    pv, tv = engine_law_p_value(eng, hf, EPROMPT, EV)
    assert eng.stats.num_accepted_tokens > 0
    if broken:
        assert pv < SIGNIFICANCE, f"the sibling-rule mutant passed (p={pv:.2f})"
    else:
        assert pv > SIGNIFICANCE, f"tree samples differ from the target (p={pv:.1e}; detects TV >= {tv:.3f})"


@pytest.mark.slow  # 2 x 6000 requests through the engine
@pytest.mark.parametrize("broken", [None, "drawn siblings verified as i.i.d."])
def test_engine_drawn_tree_samples_follow_the_target(broken, llama_pair, monkeypatch):
    """T = 1, unseeded, children drawn from the draft's q without replacement (draft_sample_method
    "probabilistic"), four at the root: the first 3 tokens of n = 6000 requests against the exact joint
    law (as above; detects TV >= ~0.07); verifying those siblings with the i.i.d. update (q never
    reduced) must fail."""
    hf, target, draft = llama_pair
    if broken:
        monkeypatch.setattr("speclab.verify.tree.recursive_rejection_sample", drawn_siblings_verified_as_iid)
    eng = tree_engine(target, draft, "[(0,), (1,), (2,), (3,), (0, 0), (0, 0, 0)]", sample_method="probabilistic")
    pv, tv = engine_law_p_value(eng, hf, EPROMPT, EV, n=6000)  # the mutant read p = 4e-8 .. 8e-5 at n = 3000
    assert eng.stats.num_accepted_tokens > 0
    if broken:
        assert pv < SIGNIFICANCE, f"the i.i.d.-update mutant passed (p={pv:.2f})"
    else:
        assert pv > SIGNIFICANCE, f"drawn-tree samples differ from the target (p={pv:.1e}; detects TV >= {tv:.3f})"


def test_seeded_tree_requests_are_drafter_invariant(llama_pair):
    """A seeded request's output is the target's keyed sample at every position: the same with a tree (its
    children top-k, or drawn for the unseeded: a seeded request still gets top-k), a chain, or no drafts at all."""
    _, target, draft = llama_pair
    params = [SamplingParams(temperature=1.0, max_tokens=12, seed=s, ignore_eos=True) for s in range(8)]
    plain = LLMEngine(load_llama(target), num_kv_blocks=512, block_size=4)
    want = [run_engine(plain, [EPROMPT], p)[0] for p in params]
    for sample_method in ("greedy", "probabilistic"):
        eng = tree_engine(target, draft, sample_method=sample_method)
        assert [run_engine(eng, [EPROMPT], p)[0] for p in params] == want, sample_method


def test_server_takes_tree_keys_and_counts_tree_drafts_by_depth():
    pytest.importorskip("fastapi", reason="the serve extra is not installed: pip install -e '.[serve]'")
    import requests

    from serve_helpers import metric, wait_idle
    from speclab.serve.launch import running_server

    with running_server(["--speculative-config", json.dumps(SPECS["draft static"]), "--max-num-seqs", "4"]) as url:
        for prompt in PROMPTS[:3]:
            r = requests.post(url + "/v1/completions", json={"model": "speclab-target", "prompt": prompt,
                                                             "max_tokens": 24, "temperature": 0}, timeout=120)
            assert r.status_code == 200, r.text
        wait_idle(url)
        drafted = metric(url, "speclab:spec_decode_num_draft_tokens_total")
        accepted = metric(url, "speclab:spec_decode_num_accepted_tokens_total")
        by_depth = [metric(url, "speclab:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
                    for i in range(6)]
        bad = requests.post(url + "/v1/completions", json={"model": "speclab-target", "prompt": "x", "max_tokens": 2})
        assert bad.status_code == 200  # the server is fine after the tree requests
    assert 0 < accepted <= drafted and sum(by_depth) == accepted
    assert by_depth[3:] == [0, 0, 0] and by_depth == sorted(by_depth, reverse=True), by_depth  # depth <= 3


@pytest.mark.parametrize("policy", [{"num_speculative_tokens_per_batch_size": {"1-64": 2}}, {"adaptive": True}],
                         ids=["batch-size table", "adaptive"])
def test_a_speculation_policys_k_is_a_trees_verified_budget(policy):
    """Dynamic speculation with a tree: the policy's k bounds the nodes verified per request (the tree's
    first k, breadth first); greedy output stays plain greedy. (Found by the lesson-10 review: every
    step failed.)"""
    spec = {**SPECS["draft static"], **policy}
    llm = LLM(speculative_config=spec, max_num_seqs=2, disable_log_stats=False)
    out = [o.outputs[0].token_ids for o in llm.generate(PROMPTS[:2], GREEDY, use_tqdm=False)]
    plain = [o.outputs[0].token_ids for o in LLM(max_num_seqs=2).generate(PROMPTS[:2], GREEDY, use_tqdm=False)]
    assert out == plain
    c = spec_decode_counters(llm.get_metrics())
    if "num_speculative_tokens_per_batch_size" in policy:
        assert c["num_draft_tokens"] <= 2 * c["num_drafts"], c
    else:
        assert c["num_draft_tokens"] <= 6 * c["num_drafts"], c
