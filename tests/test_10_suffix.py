"""Lesson 10: suffix decoding (speclab/proposers/suffix.py), vLLM's `method: "suffix"`.

The suffix structure is checked against brute-force substring counts; the proposer against the
rules it states (frequency scoring, the adaptive length max_spec_factor * match length, the
min_token_prob cut, the global tree bounded and evicted oldest first). In the engine, on the
embedded target: greedy output with suffix drafts is plain greedy output (a pool small enough to
preempt included); a request asked a second time accepts >= 70 % of its drafts; and on the held-out
chat edit set replayed as multi-turn edit sessions suffix decoding beats prompt lookup (n-gram).
"""

import random
from collections import Counter

import pytest
from tokenizers import Tokenizer

from helpers import run_engine
from speclab.data import load_chat_prompts
from speclab.engine.llm_engine import LLMEngine
from speclab.engine.proposer import Proposer
from speclab.engine.request import Request
from speclab.models import checkpoint_dir
from speclab.models.llama import load_llama
from speclab.proposers import METHODS
from speclab.proposers.ngram import NgramProposer
from speclab.proposers.suffix import SuffixProposer, SuffixTree
from speclab.sampling_params import SamplingParams
from speclab.spec_config import SpeculativeConfig

# ----------------------------------------------------------------------------------------------
# The suffix tree against brute force


def substring_counts(seqs, max_depth):
    """Occurrences of every substring of length 1..max_depth, counted over the sequences."""
    counts = Counter()
    for s in seqs:
        for i in range(len(s)):
            for j in range(i + 1, min(i + max_depth, len(s)) + 1):
                counts[tuple(s[i:j])] += 1
    return counts


def tree_counts(tree):
    counts, stack = Counter(), [((), tree.root)]
    while stack:
        path, node = stack.pop()
        for t, child in node.children.items():
            assert child.count > 0, "no empty node is kept"
            counts[path + (t,)] = child.count
            stack.append((path + (t,), child))
    return counts


def test_tree_counts_every_substring_up_to_its_depth_and_removal_undoes_it():
    rng = random.Random(0)
    seqs = {f"s{i}": [rng.randrange(4) for _ in range(rng.randrange(1, 40))] for i in range(6)}
    tree = SuffixTree(max_depth=5)
    for key, s in seqs.items():  # in uneven pieces: extend appends
        cut = len(s) // 3
        tree.extend(key, s[:cut])
        tree.extend(key, s[cut:])
    assert tree_counts(tree) == substring_counts(seqs.values(), 5)
    for key in ("s1", "s4"):
        tree.remove(key)
        del seqs[key]
        assert tree_counts(tree) == substring_counts(seqs.values(), 5)
    for key in list(seqs):
        tree.remove(key)
    assert not tree.root.children and len(tree) == 0


def test_draft_follows_the_most_frequent_continuation_and_stops_at_min_token_prob():
    tree = SuffixTree(max_depth=8)
    tree.extend("a", [7, 1, 2, 3, 7, 1, 2, 3, 7, 1, 2, 4, 7, 1, 5])
    # after (7, 1): 2 three times, 5 once -> 2 (3/4); after (7, 1, 2): 3 twice, 4 once -> 3 (3/4 * 2/3 = 1/2)
    draft, score = tree.speculate([9, 7, 1], max_tokens=4, max_spec_factor=2.0, min_token_prob=0.1)
    assert draft[:2] == [2, 3] and score == pytest.approx(0.75 + 0.5 + 0.5 + 0.5)
    draft, _ = tree.speculate([9, 7, 1], max_tokens=4, max_spec_factor=2.0, min_token_prob=0.6)
    assert draft == [2], "the running product 3/4 * 2/3 = 1/2 < 0.6 stops the draft"
    assert tree.speculate([8, 8], 4, 1.0, 0.1) == ([], 0.0), "an unseen context drafts nothing"


def test_draft_length_adapts_to_the_match_length():
    tree = SuffixTree(max_depth=24)
    tree.extend("a", list(range(100, 120)))  # one occurrence: every continuation has frequency 1
    for m in (1, 2, 5):
        context = [0] + list(range(100, 100 + m))  # matches exactly m tokens
        for factor in (1.0, 0.5, 2.0):
            draft, _ = tree.speculate(context, max_tokens=8, max_spec_factor=factor, min_token_prob=0.1)
            assert draft == list(range(100 + m, 100 + m + min(8, int(factor * m)))), (m, factor)


# ----------------------------------------------------------------------------------------------
# The proposer, on hand-made requests


def request(rid, prompt, output=()):
    r = Request(rid, list(prompt), SamplingParams(max_tokens=64))
    r.output_token_ids = list(output)
    return r


def test_it_is_a_proposer_with_vllms_keys_and_defaults():
    p = SuffixProposer(8)
    assert isinstance(p, Proposer) and p.num_lookahead_tokens == 0 and p.hidden_layers == ()
    assert (p.max_tree_depth, p.max_cached_requests, p.max_spec_factor, p.min_token_prob) == (24, 10000, 1.0, 0.1)

    spec = SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 5,
                                        "suffix_decoding_max_tree_depth": 16,
                                        "suffix_decoding_max_cached_requests": 3,
                                        "suffix_decoding_min_token_prob": 0.25})
    q = METHODS["suffix"](spec, None)
    assert (q.num_speculative_tokens, q.max_tree_depth, q.max_cached_requests, q.max_spec_factor,
            q.min_token_prob) == (5, 16, 3, 1.0, 0.25)
    with pytest.raises(ValueError, match="suffix_decoding_max_tree_depth"):  # checked with the config, before any model
        SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 5, "suffix_decoding_max_tree_depth": 1})
    with pytest.raises(ValueError, match="takes no 'model'"):
        SpeculativeConfig.from_dict({"method": "suffix", "num_speculative_tokens": 5, "model": "draft"})


@pytest.mark.parametrize("kw,match", [(dict(num_speculative_tokens=0), "num_speculative_tokens"),
                                      (dict(max_tree_depth=1), "max_tree_depth"),
                                      (dict(max_cached_requests=-1), "max_cached_requests"),
                                      (dict(max_spec_factor=0.0), "max_spec_factor"),
                                      (dict(min_token_prob=1.5), "min_token_prob")])
def test_bad_keys_get_clear_errors(kw, match):
    with pytest.raises(ValueError, match=match):
        SuffixProposer(**{"num_speculative_tokens": 4, **kw})


def test_drafts_from_the_prompt_and_respects_max_drafts():
    p = SuffixProposer(6)
    prompt = [5, 6, 7, 8, 9, 10, 11, 1, 5, 6, 7]
    [prop] = p.propose([request("a", prompt)], [6])
    assert prop.token_ids == [8, 9, 10] and prop.draft_probs is None  # match (5, 6, 7): at most 3 drafts
    assert p.propose([request("a", prompt)], [2])[0].token_ids == [8, 9]
    assert p.propose([request("a", prompt)], [0])[0].token_ids == []


def test_global_tree_remembers_earlier_outputs_bounded_oldest_first():
    p = SuffixProposer(8, max_cached_requests=2)
    answer = [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]
    for rid in ("old", "mid", "new"):
        p.propose([request(rid, [1, 2, 3], answer if rid == "old" else [60 + len(rid), 61])], [8])
        p.remove([rid])  # finished: its own tree goes, its output stays in the global tree
    assert list(p._cached) == ["mid", "new"] and "old" not in p.global_tree and not p.local
    # "old"'s answer was evicted: a fresh request whose output starts like it gets no global draft
    assert p.propose([request("x", [9, 9, 9], answer[:4])], [8])[0].token_ids == []
    q = SuffixProposer(8)
    q.propose([request("old", [1, 2, 3], answer)], [8])
    q.remove(["old"])
    assert q.propose([request("x", [9, 9, 9], answer[:4])], [8])[0].token_ids == answer[4:8]
    off = SuffixProposer(8, max_cached_requests=0)
    off.propose([request("old", [1, 2, 3], answer)], [8])
    assert len(off.global_tree) == 0


def test_a_finished_requests_last_step_joins_the_global_tree():
    """Its last tokens were committed after its last proposal: `remove` adds them (preempted: not finished)."""
    p = SuffixProposer(8)
    r = request("a", [1, 2, 3], [40, 41])
    p.propose([r], [8])
    r.output_token_ids += [42, 43, 44]  # the last step: 3 tokens, then it finished
    r.finish("length")
    p.remove(["a"])
    assert p.global_tree.sequences["a"].tokens == [40, 41, 42, 43, 44]
    assert p.propose([request("x", [9], [40, 41])], [8])[0].token_ids == [42, 43]  # 2 = spec factor x match


def test_a_preempted_request_resumes_its_sequences():
    p = SuffixProposer(4)
    r = request("a", [1, 2, 3, 4], [5, 6])
    p.propose([r], [4])
    p.remove(["a"])  # preempted: its tree is rebuilt from the committed tokens when it comes back
    r.output_token_ids += [7, 8]
    p.propose([r], [4])
    assert p.local["a"].sequences["a"].tokens == [1, 2, 3, 4, 5, 6, 7, 8]
    assert p.global_tree.sequences["a"].tokens == [5, 6, 7, 8]  # the output, once


# ----------------------------------------------------------------------------------------------
# In the engine, on the embedded target


@pytest.fixture(scope="module")
def target():
    return load_llama(checkpoint_dir("target"))


@pytest.fixture(scope="module")
def edit_prompts():
    """The held-out chat edit set's user turns as the embedded tokenizer reads them, shortest first.

    (The tokenizer.json read by `tokenizers` directly: the same ids as AutoTokenizer, without
    importing transformers.)"""
    tokenizer = Tokenizer.from_file(str(checkpoint_dir("target") / "tokenizer.json"))
    encode = lambda text: tokenizer.encode(text).ids  # noqa: E731
    ids = sorted((encode(r["messages"][1]["content"]) for r in load_chat_prompts("edit", with_reference=True)), key=len)
    return encode, ids


def engine(target, proposer, **kw):
    return LLMEngine(target, **{"num_kv_blocks": 1024, "block_size": 16, "max_num_seqs": 64,
                                "max_num_batched_tokens": 4096, "proposer": proposer, **kw})


GREEDY = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)


def test_greedy_with_suffix_drafts_is_plain_greedy_and_a_repeat_accepts_70_percent(target, edit_prompts):
    _, ids = edit_prompts
    prompts = ids[:4]
    plain = run_engine(engine(target, None), prompts, GREEDY)
    eng = engine(target, SuffixProposer(8))
    assert run_engine(eng, prompts, GREEDY) == plain
    first = (eng.stats.num_draft_tokens, eng.stats.num_accepted_tokens)
    for i, prompt in enumerate(prompts):  # each request asked a second time, alone
        before = (eng.stats.num_draft_tokens, eng.stats.num_accepted_tokens)
        assert run_engine(eng, [prompt], GREEDY) == [plain[i]]
        drafted, accepted = eng.stats.num_draft_tokens - before[0], eng.stats.num_accepted_tokens - before[1]
        assert drafted > 0 and accepted >= 0.7 * drafted, \
            f"repeat of prompt {i}: {accepted}/{drafted} drafts accepted (first pass: {first[1]}/{first[0]})"
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks


def test_greedy_with_suffix_drafts_survives_preemption_and_truncated_drafts(target, edit_prompts):
    _, ids = edit_prompts
    prompts = ids[:3] * 2  # the repeats draft long from the global tree
    plain = run_engine(engine(target, None), prompts, GREEDY)
    small = engine(target, SuffixProposer(8), num_kv_blocks=24, max_num_batched_tokens=96)
    assert run_engine(small, prompts, GREEDY) == plain
    assert small.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
    assert small.stats.num_accepted_tokens > 0 and small.kv.num_free_blocks == small.kv.pool.num_blocks


FOLLOW_UPS = ("\n\nNow add type hints to the function above. Change nothing else; reply with the whole function.\n\n",
              "\n\nNow add a docstring to it. Change nothing else; reply with the whole function.\n\n")


def edit_sessions(eng, encode, firsts, params):
    """Each prompt opens a 3-turn edit session (turn t + 1's prompt: turn t's prompt, its answer and a
    follow-up); the sessions run side by side, turn by turn. Returns every turn's answers."""
    answers, prompts = [], list(firsts)
    for turn in range(len(FOLLOW_UPS) + 1):
        outs = run_engine(eng, prompts, params)
        answers.append(outs)
        if turn < len(FOLLOW_UPS):
            prompts = [p + o + encode(FOLLOW_UPS[turn]) for p, o in zip(prompts, outs)]
    return answers


def speculation_figures(eng, answers):
    """Acceptance rate and tokens per target forward (every step emits 1 + accepted tokens)."""
    s = eng.stats
    out = sum(len(a) for turn in answers for a in turn)
    return s.num_accepted_tokens / max(s.num_draft_tokens, 1), out / (out - s.num_accepted_tokens)


@pytest.mark.slow
def test_suffix_beats_prompt_lookup_on_multi_turn_edit_sessions(target, edit_prompts):
    """The 8 edit prompts of <= 200 tokens, 3-turn sessions of 40-token answers, run twice (the second
    pass: the same sessions replayed, as agents retry). Greedy, so the answers are the same for all."""
    encode, ids = edit_prompts
    firsts = [p for p in ids if len(p) <= 200]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    figures, answers = {}, {}
    for name, proposer in (("ngram", NgramProposer(2, 5, 8)), ("suffix", SuffixProposer(8))):
        eng = engine(target, proposer)
        once = edit_sessions(eng, encode, firsts, params)
        figures[name, "once"] = speculation_figures(eng, once)
        answers[name] = once + edit_sessions(eng, encode, firsts, params)
        figures[name, "twice"] = speculation_figures(eng, answers[name])
    assert answers["ngram"] == answers["suffix"], "greedy answers do not depend on the drafter"
    table = ", ".join(f"{n} {p}: acceptance {a:.3f}, tokens/forward {t:.3f}" for (n, p), (a, t) in figures.items())
    print(table)
    for passes in ("once", "twice"):
        assert figures["suffix", passes][1] > 1.2 * figures["ngram", passes][1], table
        assert figures["suffix", passes][0] > figures["ngram", passes][0], table
