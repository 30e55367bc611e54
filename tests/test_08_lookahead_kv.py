"""Lookahead slots (lesson 08): the scheduler's block bookkeeping under random verify/rollback.

A head that drafts after the target forward (EAGLE, MTP) writes its first pass at the committed
positions and its chain at positions num_computed .. num_computed + k - 2, into the target's
block tables. Random schedules (token budgets, pools that force preemption, drafts of random
length, random acceptance, aborts) must keep: every block owned once or free; a scheduled request
holding slots for its new tokens plus k lookahead slots when it samples; after each commit, a
decoding request holding exactly ceil((num_computed + k) / block_size) blocks (the chain's slots,
nothing leaked past them); and every block back in the pool at the end.
"""

import random

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from speclab.engine.request import Request
from speclab.engine.scheduler import Scheduler
from speclab.kv_cache import KVCacheManager
from speclab.sampling_params import SamplingParams
from tests.test_05_kv_cache import check_invariants

V = 50


@settings(max_examples=120, deadline=None)
@given(num_blocks=st.integers(3, 40), block_size=st.sampled_from([1, 2, 3, 4, 16]), k=st.integers(1, 4),
       budget=st.integers(5, 30), prompts=st.lists(st.integers(1, 12), min_size=1, max_size=5),
       max_tokens=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_lookahead_slots_survive_verify_rollback_and_preemption(num_blocks, block_size, k, budget, prompts,
                                                                max_tokens, seed):
    kv = KVCacheManager(num_blocks, block_size)
    assume(all(kv.blocks_for(p + max_tokens + k) <= num_blocks for p in prompts))  # LLMEngine.check_request
    assume(budget >= 1 + k)
    sched = Scheduler(kv, budget, max_num_seqs=len(prompts), num_lookahead_tokens=k, num_speculative_tokens=k)
    rng = random.Random(seed)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    for i, n in enumerate(prompts):
        sched.add_request(Request(str(i), [rng.randrange(V) for _ in range(n)], params))
    for _ in range(400):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        check_invariants(kv, num_blocks)
        for s in out.scheduled:
            need = s.start + s.num_new_tokens + (k if s.samples else 0)
            assert len(kv.block_tables[s.request.request_id]) >= kv.blocks_for(need), "new tokens or lookahead unallocated"
        sampled = {}
        for s in out.scheduled:
            if s.samples:
                accepted = rng.randint(0, s.num_draft_tokens)
                sampled[s.request.request_id] = s.request.spec_token_ids[:accepted] + [rng.randrange(V)]
        result = sched.update_from_output(out, sampled)
        check_invariants(kv, num_blocks)
        drafts = {}
        for r in result.decoding:
            table = kv.block_tables[r.request_id]
            assert len(table) == kv.blocks_for(r.num_computed_tokens + k), \
                f"after commit: {len(table)} blocks for {r.num_computed_tokens} computed tokens + {k} lookahead"
            kv.slot_mapping(r.request_id, 0, r.num_computed_tokens + k - 1)  # the head's chain slots exist
            most = max(0, min(k, max_tokens - len(r.output_token_ids) - 1))  # as ModelRunner.propose limits them
            drafts[r.request_id] = ([rng.randrange(V) for _ in range(rng.randint(0, most))], None)
        sched.update_draft_token_ids(drafts)
        if rng.random() < 0.05 and sched.running:  # an abort now and then
            sched.finish_requests([rng.choice(sched.running).request_id])
    assert not sched.has_unfinished()
    assert kv.num_free_blocks == num_blocks, "blocks leaked"
