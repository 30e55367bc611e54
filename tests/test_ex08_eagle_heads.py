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
    """A random padded batch: each request ran its committed rows plus k drafts, of which the last
    `rejected` were rejected; only its valid rows (through the last accepted one) are graded."""
    rng = random.Random(seed)
    target, qsl, nxt, rej, want_rows = [], [0], [], [], {}
    for _ in range(rng.randint(1, 4)):
        seq = [rng.randrange(V) for _ in range(rng.randint(2, 9))]  # committed tokens; seq[-1] just sampled
        start = rng.randint(0, len(seq) - 2)  # the target ran rows start .. len(seq) - 2 of them ...
        k_rej = rng.choice([0, 0, 1, 2, 3])
        base = len(target)
        target += seq[start:len(seq) - 1] + [rng.randrange(V) for _ in range(k_rej)]  # ... then rejected drafts
        qsl.append(len(target))
        nxt.append(seq[-1])
        rej.append(k_rej)
        for j, t in enumerate(seq[start + 1:]):  # valid row base + j reads x_{t+1}; the last the sampled token
            want_rows[base + j] = t
    want_last = [qsl[b + 1] - 1 - rej[b] for b in range(len(nxt))]
    got = fn(list(target), list(qsl), list(nxt), list(rej))
    if not (isinstance(got, tuple) and len(got) == 2):
        return f"eagle_input_ids returns (input_ids, last_token_indices), got {got!r}"
    ids, last = list(got[0]), [int(x) for x in got[1]]
    where = f"target rows {target} (requests split at {qsl}), sampled {nxt}, rejected {rej}"
    if last != want_last:
        if last == [q - 1 for q in qsl[1:]]:
            return (f"{where}: last_token_indices {last} point at each request's last row, but the last "
                    f"num_rejected_tokens rows are rejected drafts left as padding: want {want_last} "
                    f"(query_start_loc[b + 1] - 1 - num_rejected_tokens[b])")
        return f"{where}: last_token_indices should be {want_last}, got {last}"
    if len(ids) != len(target):
        return f"{where}: input_ids has one entry per target row ({len(target)}), got {len(ids)}"
    bad = {r: (ids[r], t) for r, t in want_rows.items() if ids[r] != t}
    if bad:
        r = min(bad)
        if ids[r] == target[r]:
            return (f"{where}: row {r} reads {ids[r]}, the token the target ran there; the first pass reads the "
                    f"token one position ahead (shift left by one), want {want_rows[r]}")
        return (f"{where}: valid row {r} should read {want_rows[r]} (the next token, or at each request's last valid "
                f"row the token just sampled), got {ids[r]}; want on the valid rows "
                f"{[want_rows[i] for i in sorted(want_rows)]}")
    return None


def test_input_shift_worked_example(impl):
    # vLLM's eagle.py example: [a1, b1, b2, c1, c2, c3] -> [a2, b2, b3, c2, c3, c4], nothing rejected
    ids, last = impl.eagle_input_ids([10, 20, 21, 30, 31, 32], [0, 1, 3, 6], [11, 22, 33], [0, 0, 0])
    if list(ids) != [11, 21, 22, 31, 32, 33] or list(last) != [0, 2, 5]:
        pytest.fail(f"[a1, b1, b2, c1, c2, c3] with sampled [a2, b3, c4] and nothing rejected must give "
                    f"[a2, b2, b3, c2, c3, c4] = [11, 21, 22, 31, 32, 33] with last rows [0, 2, 5]; got {ids}, {last}",
                    pytrace=False)


def test_input_shift_on_random_padded_batches(impl):
    for seed in range(80):
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
    if got.shape != want.shape:
        return f"Medusa head 2 on 5 random hidden states (5, d): logits of shape {tuple(want.shape)}, got {tuple(got.shape)}"
    if torch.allclose(got.float(), want, atol=1e-4, rtol=1e-4):
        return None
    W, b, lm, norm = block.weight, block.bias, tiny.lm_head.weight, tiny.model.norm
    with torch.no_grad():
        z = norm(h)
        known = {  # wrong answers seen in practice, each named
            "the residual is missing: lm_head(SiLU(W z + b)) instead of lm_head(z + SiLU(W z + b))":
                F.linear(F.silu(F.linear(z, W, b)), lm),
            "the final norm is missing: z = norm(h) must feed the block (the target's norm, shared)":
                F.linear(h + F.silu(F.linear(h, W, b)), lm),
            "the norm is applied after the block: z = norm(h) first, then z + SiLU(W z + b)":
                F.linear(norm(h + F.silu(F.linear(h, W, b))), lm),
            "the bias b is missing": F.linear(z + F.silu(F.linear(z, W)), lm),
            "W is applied transposed: F.linear(z, W, b) computes z @ W.T + b": F.linear(z + F.silu(z @ W + b), lm),
            "ReLU (or no activation) in place of SiLU": F.linear(z + F.relu(F.linear(z, W, b)), lm),
            "the head returns probabilities: Medusa's head gives logits (softmax comes later)":
                F.linear(z + F.silu(F.linear(z, W, b)), lm).softmax(-1),
        }
    for what, wrong in known.items():
        if torch.allclose(got.float(), wrong, atol=1e-4, rtol=1e-4):
            return f"Medusa head 2 on 5 random hidden states: {what}"
    return (f"Medusa head 2 on 5 random hidden states: want lm_head(z + SiLU(W z + b)), z = norm(h); got max "
            f"error {(got.float() - want).abs().max():.3g}")


def test_medusa_head_is_a_residual_block_and_the_shared_lm_head(impl, tiny):
    if (msg := check_medusa(impl.medusa_logits, tiny)):
        pytest.fail(msg, pytrace=False)


# ----------------------------------------------------------------------------------------------
# negative controls: wrong answers the grader must reject


def shift_without_next(ids, qsl, nxt, rej):
    last = [qsl[b + 1] - 1 - rej[b] for b in range(len(nxt))]
    return list(ids[1:]) + [nxt[-1]], last  # the sampled tokens only at the very end


def shift_not_at_all(ids, qsl, nxt, rej):
    out = list(ids)
    last = [qsl[b + 1] - 1 - rej[b] for b in range(len(nxt))]
    for b, t in enumerate(nxt):
        out[last[b]] = t
    return out, last


def shift_ignoring_rejections(ids, qsl, nxt, rej):  # the lesson's unpadded cell, transcribed
    out = list(ids[1:]) + [0]
    for b, t in enumerate(nxt):
        out[qsl[b + 1] - 1] = t
    return out, [q - 1 for q in qsl[1:]]


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


def medusa_transposed(h, norm, W, b, lm):
    z = norm(h)
    return F.linear(z + F.silu(z @ W + b), lm)


def medusa_no_bias(h, norm, W, b, lm):
    z = norm(h)
    return F.linear(z + F.silu(F.linear(z, W)), lm)


def test_negative_controls_fail(controls, tiny):
    for bad, needle in ((shift_without_next, "valid row"), (shift_not_at_all, "one position ahead"),
                        (shift_ignoring_rejections, "rejected drafts left as padding")):
        msgs = [m for m in (check_shift(bad, s) for s in range(80)) if m]
        assert msgs and needle in msgs[0], f"the grader accepts {bad.__name__} or misnames it: {msgs[:1]}"
    for bad in (chain_one_step_too_many, chain_reusing_first_feature, chain_same_position):
        assert any(check_chain_calls(bad, k) for k in (1, 2, 5)), f"the grader accepts {bad.__name__}"
    for bad, needle in ((medusa_without_residual, "residual is missing"), (medusa_without_norm, "norm is missing"),
                        (medusa_transposed, "transposed"), (medusa_no_bias, "bias b is missing")):
        msg = check_medusa(bad, tiny)
        assert msg and needle in msg, f"the grader accepts {bad.__name__} or misnames it: {msg}"
