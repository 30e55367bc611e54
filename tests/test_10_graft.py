"""Lesson 10: a lookup's draft grafted into a model drafter's tree (`graft_method`, speclab.proposers.graft).

The graft itself (where the chain goes, breadth-first order, a prefix still a tree), the config's checks
and budget, greedy output equal to plain greedy with preemption (EAGLE and the draft model, static and
dynamic trees, n-gram and suffix lookups), a graft that pays where text repeats, and the sampled law at
T = 1 equal to the target's (chi-squared; the sibling-rule mutant as the negative control).

The statistical test fails at p < 1e-4 and states the smallest total-variation distance it detects with
power 0.99 (`stats.min_detectable_tv`).
"""

import pytest

from helpers import engine_law_p_value, outputs_and_counters
from mutants import sample_tree_without_removal
from speclab import LLM, SamplingParams
from speclab.engine.llm_engine import LLMEngine
from speclab.models.llama import load_llama
from speclab.proposers.draft_model import DraftModelProposer
from speclab.proposers.graft import GraftedProposer, graft
from speclab.proposers.ngram import NgramProposer
from speclab.proposers.tree_drafting import TreeShape
from speclab.spec_config import SpeculativeConfig
from speclab.verify.tree import parse_tree, star_literal

SIGNIFICANCE = 1e-4
STAR3 = star_literal(3)
TREE6 = "[(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]"
NGRAM = {"graft_method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}


# ----------------------------------------------------------------------------------------------
# The graft


def node_paths(tokens, tree):
    """{token path from the root: child-rank path} of every node: what the tree says, order aside."""
    out = {}
    for i in range(1, tree.num_nodes + 1):
        path = tree.ancestors(i)[1:]
        out[tuple(tokens[j - 1] for j in path)] = tuple(tree.ranks[j] for j in path)
    return out


def check_breadth_first(tree):
    assert list(tree.depths[1:]) == sorted(tree.depths[1:]), "depths must not decrease"
    assert all(0 <= p < i for i, p in enumerate(tree.parents) if i), "a parent comes before its child"


def test_a_chain_that_starts_with_a_drafted_token_continues_under_it():
    tokens, tree = graft([10, 11, 12], parse_tree(STAR3), [11, 20, 21])
    check_breadth_first(tree)
    assert tokens == [10, 11, 12, 20, 21]
    assert node_paths(tokens, tree) == {(10,): (0,), (11,): (1,), (12,): (2,), (11, 20): (1, 0),
                                        (11, 20, 21): (1, 0, 0)}


def test_a_chain_the_tree_lacks_is_the_roots_last_branch():
    tokens, tree = graft([10, 11, 12], parse_tree(STAR3), [30, 31])
    check_breadth_first(tree)
    assert tokens == [10, 11, 12, 30, 31]
    assert node_paths(tokens, tree)[(30,)] == (3,) and node_paths(tokens, tree)[(30, 31)] == (3, 0)


def test_a_chain_follows_the_tree_as_deep_as_it_matches():
    base = parse_tree(TREE6)  # nodes: (0,) (1,) (0,0) (0,1) (1,0) (0,0,0)
    drafted = [1, 2, 3, 4, 5, 6]  # (0,)=1 (1,)=2 (0,0)=3 (0,1)=4 (1,0)=5 (0,0,0)=6
    tokens, tree = graft(drafted, base, [1, 4, 9, 8])  # (0,) then (0, 1), then new under (0, 1)
    check_breadth_first(tree)
    paths = node_paths(tokens, tree)
    assert paths[(1, 4, 9)] == (0, 1, 0) and paths[(1, 4, 9, 8)] == (0, 1, 0, 0)
    assert tree.num_nodes == 8
    assert {k: v for k, v in paths.items() if len(k) < 3 or k == (1, 3, 6)} == node_paths(drafted, base)
    assert tokens[:6] == drafted, "the drafter's nodes keep their order; new ones follow within their depth"
    for n in range(tree.num_nodes + 1):  # any prefix is a tree: what a smaller budget verifies
        check_breadth_first(tree.truncate(n))


def test_nothing_new_leaves_the_tree_as_it_was():
    base = parse_tree(STAR3)
    assert graft([10, 11, 12], base, [12]) == ([10, 11, 12], base)
    assert graft([10, 11, 12], base, []) == ([10, 11, 12], base)


def test_a_chain_drafter_and_an_empty_draft_graft_too():
    tokens, tree = graft([5, 6], None, [5, 7])  # a chain 5 -> 6; the lookup agrees on 5, then says 7
    assert node_paths(tokens, tree) == {(5,): (0,), (5, 6): (0, 0), (5, 7): (0, 1)}
    tokens, tree = graft([], None, [8, 9])
    assert tokens == [8, 9] and tree.parents == (-1, 0, 1)
    with pytest.raises(ValueError, match="tokens for a tree"):
        graft([1, 2], parse_tree(STAR3), [3])


# ----------------------------------------------------------------------------------------------
# The config


def test_config_splits_the_budget_between_tree_and_lookup():
    spec = SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 6,
                                        "speculative_token_tree": STAR3, **NGRAM})
    drafter, lookup = spec.grafted_parts()
    assert (drafter.method, drafter.num_speculative_tokens, drafter.graft_method) == ("eagle", 3, None)
    assert (lookup.method, lookup.num_speculative_tokens, lookup.prompt_lookup_max) == ("ngram", 3, 3)
    dyn = SpeculativeConfig.from_dict({"method": "draft_model", "model": "draft", "num_speculative_tokens": 5,
                                       "speculative_num_steps": 2, "speculative_eagle_topk": 2,
                                       "speculative_num_draft_tokens": 4, "graft_method": "suffix"})
    assert [p.num_speculative_tokens for p in dyn.grafted_parts()] == [3, 2]


@pytest.mark.parametrize("extra, match", [
    ({"num_speculative_tokens": 3, "graft_method": "ngram"}, "tree"),  # no tree: nothing to graft into
    ({"num_speculative_tokens": 3, "speculative_token_tree": STAR3, "graft_method": "ngram"}, "set it above 3"),
    ({"num_speculative_tokens": 6, "speculative_token_tree": STAR3, "graft_method": "medusa"}, "one of"),
    ({"num_speculative_tokens": 6, "speculative_token_tree": STAR3, "graft_method": "ngram",
      "prompt_lookup_min": 4, "prompt_lookup_max": 2}, "prompt_lookup_min=4"),
    ({"num_speculative_tokens": 6, "speculative_token_tree": STAR3, "graft_method": "suffix",
      "suffix_decoding_min_token_prob": 2}, "min_token_prob"),
    ({"num_speculative_tokens": 4, "speculative_token_tree": STAR3}, "must be equal"),  # no graft: vLLM's rule
    ({"method": "ngram", "num_speculative_tokens": 6, "graft_method": "suffix"}, "tree"),  # a lookup has no tree
])
def test_config_refuses_a_graft_it_cannot_build_with_the_fix(extra, match):
    with pytest.raises(ValueError, match=match):
        SpeculativeConfig.from_dict({"method": "eagle", **extra})


# ----------------------------------------------------------------------------------------------
# In the engine: the embedded pair, greedy

PROMPTS = ["def fibonacci(n):", "the cat sat on the", "import os\nimport sys\nimport os\nimport", "1 2 3 4 5 6",
           "for i in range(10):\n    print(i)\nfor i in range(10):"]
GREEDY = SamplingParams(temperature=0, max_tokens=40)
SPECS = {
    "eagle star + ngram": {"method": "eagle", "num_speculative_tokens": 6, "speculative_token_tree": STAR3, **NGRAM},
    "draft star + suffix": {"method": "draft_model", "model": "draft", "num_speculative_tokens": 5,
                            "speculative_token_tree": STAR3, "graft_method": "suffix"},
    "eagle dynamic + ngram": {"method": "eagle", "num_speculative_tokens": 6, "speculative_num_steps": 2,
                              "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4, **NGRAM},
}


@pytest.fixture(scope="module")
def plain_greedy():
    return [o.outputs[0].token_ids for o in LLM().generate(PROMPTS, GREEDY, use_tqdm=False)]


def counters(spec, **kw):
    return outputs_and_counters(spec, PROMPTS, GREEDY, **kw)


@pytest.mark.parametrize("name", [n if n == "eagle star + ngram" else pytest.param(n, marks=pytest.mark.slow)
                                  for n in SPECS])
def test_a_grafted_tree_gives_plain_greedy_with_preemption(name, plain_greedy):
    out, c, _ = counters(SPECS[name])
    assert out == plain_greedy, name
    assert 0 < c["num_accepted_tokens"] < c["num_draft_tokens"]
    small, _, llm = counters(SPECS[name], num_kv_blocks=16, block_size=4, max_num_batched_tokens=20, max_num_seqs=4)
    assert small == plain_greedy, f"{name} with preemption and a small token budget"
    assert llm.engine.scheduler.num_preemptions > 0, "the pool was meant to force preemption"


def test_the_graft_pays_where_text_repeats():
    """Greedy, so deterministic: on prompts that repeat themselves the lookup's branch is accepted
    beyond the star's depth of 1, and the mean acceptance length grows."""
    _, alone, _ = counters({"method": "eagle", "num_speculative_tokens": 3, "speculative_token_tree": STAR3})
    _, grafted, _ = counters(SPECS["eagle star + ngram"])
    print(f"mean acceptance length: star {alone['mean_acceptance_length']:.3f}, star + n-gram "
          f"{grafted['mean_acceptance_length']:.3f}")
    assert alone["num_accepted_tokens_per_pos"][1:] == [0, 0], "a star drafts depth 1 only"
    assert grafted["num_accepted_tokens_per_pos"][1] > 0, "no grafted token was accepted past depth 1"
    assert grafted["mean_acceptance_length"] > alone["mean_acceptance_length"] + 0.2


# ----------------------------------------------------------------------------------------------
# The law, T = 1: tiny random Llamas over 8 tokens

EV, EPROMPT = 8, [1, 2, 3, 1, 2]


def grafted_engine(target, draft):
    """The draft's 2-star with a 2-token n-gram chain grafted in (the prompt repeats, so it matches)."""
    shape = TreeShape(static=parse_tree(star_literal(2)))
    drafter = DraftModelProposer(load_llama(draft), 2, num_kv_blocks=8192, block_size=4, tree=shape)
    proposer = GraftedProposer(drafter, NgramProposer(1, 2, 2))
    return LLMEngine(load_llama(target), proposer=proposer, num_kv_blocks=8192, block_size=4, max_num_seqs=2048,
                     max_num_batched_tokens=1 << 15)


@pytest.mark.slow  # 2 x 3000 requests through the engine (about 30 s each under load)
@pytest.mark.parametrize("broken", [None, "siblings tested against the original p"])
def test_grafted_tree_samples_follow_the_target(broken, llama_pair, monkeypatch):
    """T = 1, unseeded: the first 3 tokens of n = 3000 requests against the exact joint law from
    transformers; the engine with the sibling-rule mutant must fail."""
    hf, target, draft = llama_pair
    if broken:
        monkeypatch.setattr("speclab.engine.model_runner.sample_tree", sample_tree_without_removal)
    eng = grafted_engine(target, draft)
    pv, tv = engine_law_p_value(eng, hf, EPROMPT, EV)
    assert eng.stats.num_draft_tokens > 2 * eng.stats.num_drafts, "no step verified a grafted node"
    assert eng.stats.num_accepted_tokens_per_pos[1] > 0, "no grafted token was accepted past depth 1"
    if broken:
        assert pv < SIGNIFICANCE, f"the sibling-rule mutant passed (p={pv:.2f})"
    else:
        assert pv > SIGNIFICANCE, f"grafted samples differ from the target (p={pv:.1e}; detects TV >= {tv:.3f})"


def test_a_graft_refuses_a_drafter_that_samples_its_drafts(llama_pair):
    """A sampled draft carries its q; a grafted tree verifies point masses only, so the proposer says so
    when it is built, not in the middle of a step."""
    _, _, draft = llama_pair
    sampled = DraftModelProposer(load_llama(draft), 2, num_kv_blocks=64, block_size=4, sample_method="probabilistic")
    with pytest.raises(ValueError, match="greedily"):
        GraftedProposer(sampled, NgramProposer(1, 2, 2))
