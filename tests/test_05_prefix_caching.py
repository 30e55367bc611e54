"""Automatic prefix caching (speclab.kv_cache, vLLM v1's): shared blocks, exact output.

The bookkeeping: a request's full blocks of committed tokens get keys chained through the previous
block's; a later request with the same leading tokens shares those blocks (reference counts), and
computes only what follows, never the block of its last prompt token; a freed block stays cached
until the pool hands it out again (tail first); shared blocks are never given out twice.
The engine: greedy output with prefix caching equals output without it, for repeated prompts,
prompts sharing a prefix, a pool small enough to preempt and evict, n-gram speculation and a draft
model (its own cache catches up over the prompt), and every block comes back. Negative control: a key of the block's tokens alone (no chain through the
prefix before it) lets a block computed at positions 16-31 serve positions 0-15, and the output
changes.
"""

import pytest
import torch

from speclab import LLM, SamplingParams
from speclab.kv_cache import KVCacheManager


def _computed(kv, rid, tokens):
    """Allocate a fresh request (with whatever prefix it matches), mark every token computed."""
    prefix = kv.match_prefix(tokens)
    kv.allocate(rid, len(prefix) * kv.block_size, len(tokens) - len(prefix) * kv.block_size, prefix=prefix)
    kv.cache_full_blocks(rid, tokens, len(tokens))
    return prefix


def test_a_later_request_shares_the_full_blocks_of_a_computed_prefix():
    kv = KVCacheManager(10, 4, enable_prefix_caching=True)
    a = list(range(100, 111))               # 11 tokens: 2 full blocks and 3 tokens
    assert _computed(kv, "a", a) == []
    b = a[:8] + [7, 7, 7, 7, 7]             # the same 2 full blocks, then its own
    shared = _computed(kv, "b", b)
    assert shared == kv.block_tables["a"][:2] and kv.block_tables["b"][:2] == shared
    assert [kv.pool.ref_count[x] for x in shared] == [2, 2]
    owned = [x for t in kv.block_tables.values() for x in t]
    assert len(owned) - 2 + kv.num_free_blocks == 10, "a shared block counts once"
    kv.free("a")
    assert [kv.pool.ref_count[x] for x in shared] == [1, 1] and not set(shared) & set(kv.pool.free_queue)
    kv.free("b")
    assert kv.num_free_blocks == 10


def test_the_last_prompt_token_is_always_computed():
    kv = KVCacheManager(10, 4, enable_prefix_caching=True)
    a = list(range(8))                      # exactly 2 full blocks
    _computed(kv, "a", a)
    kv.free("a")
    assert len(kv.match_prefix(a)) == 1, "the block of the last token must be computed again for its logits"
    assert len(kv.match_prefix(a + [9])) == 2


def test_a_freed_prefix_is_reused_until_evicted_tail_first():
    kv = KVCacheManager(4, 2, enable_prefix_caching=True)
    a = [1, 2, 3, 4, 5, 6, 9]               # 3 full blocks + 1 token: 4 blocks, the whole pool
    _computed(kv, "a", a)
    kv.free("a")
    assert len(kv.match_prefix(a)) == 3
    kv.allocate("x", 0, 2)                  # one block: the pool evicts a's tail first
    assert len(kv.match_prefix(a)) == 3, "the partial last block went first"
    kv.allocate("y", 0, 2)
    assert len(kv.match_prefix(a)) == 2, "then the last full block, not the first"
    kv.free("x"), kv.free("y")
    assert len(kv.pool.cached) == len(kv.pool.key_of) == 2


def test_a_key_chains_through_the_prefix_before_it():
    kv = KVCacheManager(10, 2, enable_prefix_caching=True)
    _computed(kv, "a", [1, 2, 3, 4, 5])
    assert kv.match_prefix([3, 4, 5, 6, 7]) == [], "the same tokens at other positions are another block"


def test_off_by_default_and_checked():
    kv = KVCacheManager(10, 2)
    _computed(kv, "a", [1, 2, 3, 4, 5])
    assert kv.match_prefix([1, 2, 3, 4, 5]) == [] and not kv.pool.cached
    with pytest.raises(TypeError, match="True or False"):
        LLM(enable_prefix_caching="yes")


def test_refused_with_a_head_that_writes_into_the_target_tables():
    with pytest.raises(ValueError, match="enable_prefix_caching=False with a head"):
        LLM(speculative_config={"method": "eagle", "num_speculative_tokens": 2}, enable_prefix_caching=True)


GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def _prompts():
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(5, 4000, (40,), generator=g).tolist()
    tails = [torch.randint(5, 4000, (n,), generator=g).tolist() for n in (3, 9, 17, 1)]
    own = torch.randint(5, 4000, (37,), generator=g).tolist()
    ps = [shared + t for t in tails] + [own, shared[:16] + own]
    return ps + ps[:3]  # and three repeated outright


def _run(prompts, split=4, **knobs):
    llm = LLM(**knobs)
    outs = []
    for chunk in (prompts[:split], prompts[split:]):  # two calls: the second finds the first's blocks
        outs += [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in chunk], GREEDY,
                                                              use_tqdm=False)]
    return outs, llm.engine


@pytest.mark.parametrize("knobs", [{}, {"num_kv_blocks": 14, "max_num_seqs": 4, "max_num_batched_tokens": 32},
                                   {"speculative_config": {"method": "ngram", "num_speculative_tokens": 3,
                                                           "prompt_lookup_max": 3, "prompt_lookup_min": 1}},
                                   {"speculative_config": {"method": "draft_model", "model": "draft",
                                                           "num_speculative_tokens": 3}}],
                         ids=["plenty", "preempt-and-evict", "ngram", "draft_model"])
def test_greedy_output_with_prefix_caching_equals_output_without(knobs):
    prompts = _prompts()
    plain, _ = _run(prompts, block_size=8, **knobs)
    cached, eng = _run(prompts, block_size=8, enable_prefix_caching=True, **knobs)
    assert cached == plain
    assert eng.kv.prefix_cache_hits >= 8 * 4 * 3, "the shared 40-token prefix (4 full blocks) was not reused"
    assert eng.kv.prefix_cache_hits <= eng.kv.prefix_cache_queries
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks and not eng.kv.block_tables
    if "num_kv_blocks" in knobs:
        assert eng.scheduler.num_preemptions > 0, "the pool was meant to force preemption"


def test_negative_control_a_key_without_the_prefix_chain_changes_the_output(monkeypatch):
    g = torch.Generator().manual_seed(1)
    x, y, z = (torch.randint(5, 4000, (16,), generator=g).tolist() for _ in range(3))
    prompts = [x + y + [9], y + z + [9]]     # y at positions 16-31, then at 0-15
    plain, _ = _run(prompts, split=1, block_size=16)
    assert _run(prompts, split=1, block_size=16, enable_prefix_caching=True)[0] == plain
    monkeypatch.setattr(KVCacheManager, "_key", lambda self, parent, tokens: tuple(tokens))
    broken, eng = _run(prompts, split=1, block_size=16, enable_prefix_caching=True)
    assert eng.kv.prefix_cache_hits == 16, "the broken key was meant to hit y's block"
    assert broken[0] == plain[0] and broken[1] != plain[1]


def test_the_server_exposes_vllms_prefix_cache_counters():
    from prometheus_client import generate_latest

    from speclab.serve.metrics import ServingMetrics
    m = ServingMetrics("m", engine_counters={"prefix_cache_queries": lambda: 40, "prefix_cache_hits": lambda: 32})
    text = generate_latest(m.registry).decode()
    assert 'speclab:prefix_cache_queries_total{engine="0",model_name="m"} 40.0' in text
    assert 'speclab:prefix_cache_hits_total{engine="0",model_name="m"} 32.0' in text
