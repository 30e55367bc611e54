"""Grades exercise 08 (EAGLE's input shift and chain, a Medusa head).
`pytest --impl=exercises tests/test_ex08_eagle_heads.py`. Negative controls at the bottom grade the
grader (skipped under --impl=exercises)."""

import random

import pytest
import torch
import torch.nn.functional as F

from speclab.engine.batch import flatten
from speclab.kv_cache import KVCacheManager
from speclab.models.heads import build_head, new_config
from speclab.models.llama import load_llama
from tests.helpers import tiny_llama

EXERCISE = "ex08_eagle_heads"
pytestmark = pytest.mark.exercise
V = 29


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("ex08")
    tiny_llama(path, vocab_size=V, head_scale=4.0)
    return load_llama(path)


# ----------------------------------------------------------------------------------------------
# 1. the input shift


def check_shift(fn, seed: int):
    rng = random.Random(seed)
    seqs = [[rng.randrange(V) for _ in range(rng.randint(2, 9))] for _ in range(rng.randint(1, 4))]
    starts = [rng.randint(0, len(s) - 2) for s in seqs]  # the target ran rows start .. L - 2 of each
    target, qsl, nxt, want = [], [0], [], []
    for s, a in zip(seqs, starts):
        target += s[a:len(s) - 1]
        qsl.append(len(target))
        nxt.append(s[-1])
        want += s[a + 1:]  # row t reads x_{t+1}; the last row the token just sampled
    got = fn(target, qsl, nxt)
    if got != want:
        return (f"target rows {target} (requests split at {qsl}), sampled {nxt}: the first pass reads the token "
                f"one position ahead of each row, and each request's last row reads its sampled token: want "
                f"{want}, got {got}")
    return None


def test_input_shift_worked_example(impl):
    # vLLM's eagle.py example: [a1, b1, b2, c1, c2, c3] -> [a2, b2, b3, c2, c3, c4]
    got = impl.eagle_input_ids([10, 20, 21, 30, 31, 32], [0, 1, 3, 6], [11, 22, 33])
    if got != [11, 21, 22, 31, 32, 33]:
        pytest.fail(f"[a1, b1, b2, c1, c2, c3] with sampled [a2, b3, c4] must give [a2, b2, b3, c2, c3, c4] "
                    f"= [11, 21, 22, 31, 32, 33], got {got}", pytrace=False)


def test_input_shift_on_random_ragged_batches(impl):
    for seed in range(50):
        if (msg := check_shift(impl.eagle_input_ids, seed)):
            pytest.fail(msg, pytrace=False)


# ----------------------------------------------------------------------------------------------
# 2. the chain


def check_chain_calls(fn, k: int):
    calls = []
    g0 = torch.zeros(3)

    def step(token, feature, position):
        calls.append((token, feature.clone(), position))
        return feature + 1 + token

    def logits(g):
        out = torch.zeros(7)
        out[int(g[0]) % 7] = 1.0
        return out

    drafts = fn(g0, 10, k, step, logits)
    want, g = [], g0
    for i in range(k):
        want.append(int(g[0]) % 7)
        g = g + 1 + want[-1]
    if drafts != want:
        return f"k={k}: want drafts {want} (each from the head's own previous output), got {drafts}"
    if len(calls) != k - 1:
        return f"k={k}: {len(calls)} head steps; k drafts need k - 1 (the first comes from first_g itself)"
    for i, (token, feature, position) in enumerate(calls):
        if token != want[i] or position != 10 + i:
            return (f"k={k}: step {i + 1} got (token={token}, position={position}); want the draft just made, "
                    f"{want[i]}, at position {10 + i}")
    return None


def test_chain_feeds_its_own_drafts_and_features_back(impl):
    for k in (1, 2, 5):
        if (msg := check_chain_calls(impl.chain_draft, k)):
            pytest.fail(msg, pytrace=False)


def test_chain_with_a_real_head_drafts_what_the_engine_drafts(impl, tiny):
    from tests.test_08_heads import reference_drafts

    torch.manual_seed(0)
    head = build_head(new_config("eagle", tiny), tiny).eval()
    tokens = torch.randint(0, V, (13,), generator=torch.Generator().manual_seed(1)).tolist()
    L, k, bs = len(tokens), 4, 4
    kv = KVCacheManager(8, bs)
    kv.allocate("r", 0, L + k)
    caches = tiny.allocate_kv_cache(8, bs)
    _, saved = tiny(*flatten(kv, [("r", tokens[:-1], 0)]), caches, head.cfg.hidden_layers)
    cache = head.allocate_kv_cache(8, bs)
    ids, meta = flatten(kv, [("r", tokens[1:], 0)])
    with torch.no_grad():
        g = head(ids, torch.cat(saved, -1), meta, cache)[-1]

        def step(token, feature, position):
            ids, meta = flatten(kv, [("r", [token], position)])
            return head(ids, feature[None], meta, cache)[0]

        got = impl.chain_draft(g, L - 1, k, step, lambda g: head.logits(g[None])[0])
    want = reference_drafts(head, tiny, tokens, k)
    if got != want:
        pytest.fail(f"a random EAGLE head on a tiny target drafts {want} from scratch; your chain drafted {got}",
                    pytrace=False)


# ----------------------------------------------------------------------------------------------
# 3. a Medusa head


def check_medusa(fn, tiny):
    torch.manual_seed(2)
    head = build_head(new_config("medusa", tiny, num_heads=2), tiny)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.5)
        h = torch.randn(5, tiny.config.hidden_size)
        want = head(h)[1]
        block = head.blocks[1].linear
        got = fn(h, tiny.model.norm, block.weight, block.bias, tiny.lm_head.weight)
    if got.shape != want.shape or not torch.allclose(got.float(), want, atol=1e-4, rtol=1e-4):
        return (f"Medusa head 2 on 5 random hidden states: want lm_head(z + SiLU(W z + b)), z = norm(h); got "
                f"max error {(got.float() - want).abs().max():.3g}" if got.shape == want.shape else
                f"shape {tuple(got.shape)}, want {tuple(want.shape)}")
    return None


def test_medusa_head_is_a_residual_block_and_the_shared_lm_head(impl, tiny):
    if (msg := check_medusa(impl.medusa_logits, tiny)):
        pytest.fail(msg, pytrace=False)


# ----------------------------------------------------------------------------------------------
# negative controls: wrong answers the grader must reject


def shift_without_next(ids, qsl, nxt):
    return list(ids[1:]) + [nxt[-1]]  # the sampled tokens only at the very end


def shift_not_at_all(ids, qsl, nxt):
    out = list(ids)
    for b, t in enumerate(nxt):
        out[qsl[b + 1] - 1] = t
    return out


def chain_one_step_too_many(g, position, k, step, logits):
    drafts = []
    for i in range(k):
        drafts.append(int(logits(g).argmax()))
        g = step(drafts[-1], g, position + i)
    return drafts


def chain_reusing_first_feature(g0, position, k, step, logits):
    drafts, g = [], g0
    for i in range(k):
        drafts.append(int(logits(g).argmax()))
        if i + 1 < k:
            g = step(drafts[-1], g0, position + i)
    return drafts


def chain_same_position(g, position, k, step, logits):
    drafts = []
    for i in range(k):
        drafts.append(int(logits(g).argmax()))
        if i + 1 < k:
            g = step(drafts[-1], g, position)
    return drafts


def medusa_without_residual(h, norm, W, b, lm):
    return F.linear(F.silu(F.linear(norm(h), W, b)), lm)


def medusa_without_norm(h, norm, W, b, lm):
    return F.linear(h + F.silu(F.linear(h, W, b)), lm)


def test_negative_controls_fail(controls, tiny):
    for bad in (shift_without_next, shift_not_at_all):
        assert any(check_shift(bad, s) for s in range(50)), f"the grader accepts {bad.__name__}"
    for bad in (chain_one_step_too_many, chain_reusing_first_feature, chain_same_position):
        assert any(check_chain_calls(bad, k) for k in (1, 2, 5)), f"the grader accepts {bad.__name__}"
    for bad in (medusa_without_residual, medusa_without_norm):
        assert check_medusa(bad, tiny), f"the grader accepts {bad.__name__}"
