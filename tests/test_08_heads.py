"""Heads on the target's hidden states (lesson 08): EAGLE, EAGLE-3-style fusion, MTP, Medusa.

What must hold whatever the head's quality (random heads on a tiny random target):
  - greedy output with a head equals plain output (float32), in ragged batches, with a token budget
    that chunks prefills and truncates drafts, and a pool small enough to preempt; all blocks return;
  - the head's incremental paged KV (lookahead slots in the target's block tables, rewritten after
    rejections, freed by preemption) drafts exactly what a from-scratch run of the head drafts;
  - the training forward (dense, training-time-test masks) is the inference forward;
  - a head made for another target, or for another method, is refused with a message naming it.
The statistical tests (T = 1, top-p, with a negative control that must fail) are in test_08_heads_law.py.
"""

import pytest
import torch

from speclab.engine.batch import flatten
from speclab.engine.llm_engine import LLMEngine
from speclab.kv_cache import KVCacheManager
from speclab.models.heads.eagle import ttt_mask
from speclab.models.heads import build_head, load_head, new_config, save_head
from speclab.models.llama import load_llama
from speclab.proposers.eagle import EagleProposer
from speclab.proposers.medusa import MedusaProposer
from speclab.proposers.mtp import MTPProposer
from speclab.sampling_params import SamplingParams
from tests.helpers import run_engine, tiny_llama

V = 37  # not a power of two
PROPOSERS = {"eagle": EagleProposer, "eagle3": EagleProposer, "mtp": MTPProposer, "medusa": MedusaProposer}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    tiny_llama(path, vocab_size=V, num_hidden_layers=4, head_scale=6.0, max_position_embeddings=128)
    return load_llama(path)


def random_head(target, method, seed=0):
    torch.manual_seed(seed)
    layers = (0, 2, 4) if method == "eagle3" else None
    head = build_head(new_config(method, target, hidden_layers=layers, num_heads=4 if method == "medusa" else 0), target)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "linear.weight" in name:  # Medusa's zero-initialised residual: give it something to do
                p.normal_(0, 0.3)
    return head.eval()


def engine(target, proposer=None, **kw):
    return LLMEngine(target, **{"num_kv_blocks": 400, "block_size": 4, "max_num_seqs": 64,
                                "max_num_batched_tokens": 4096, "proposer": proposer, **kw})


SCHEDULES = {"roomy": {}, "budget 6: chunked prefill, truncated drafts": dict(max_num_batched_tokens=6, max_num_seqs=6),
             "pool of 19 blocks: preemption": dict(num_kv_blocks=19, max_num_batched_tokens=7, max_num_seqs=7)}


SLOW = pytest.mark.slow  # the fast loop keeps one case of each family


@pytest.mark.parametrize("method,sample_method", [(m, "greedy") for m in PROPOSERS] +
                         [pytest.param(m, "probabilistic", marks=SLOW) for m in PROPOSERS])
def test_greedy_output_with_a_head_equals_plain_output(tiny, method, sample_method):
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 4, 9, 17, 30)]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = run_engine(engine(tiny), prompts, params)
    head = random_head(tiny, method)
    for name, knobs in SCHEDULES.items():
        eng = engine(tiny, PROPOSERS[method](head, 3, sample_method=sample_method), **knobs)
        assert run_engine(eng, prompts, params) == plain, f"{method}, {name}: output differs from plain decoding"
        assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks, f"{method}, {name}: KV blocks leaked"
        assert eng.stats.num_draft_tokens > 0
        if "preemption" in name:
            assert eng.scheduler.num_preemptions > 0, "the pool was meant to force preemption"
        if method != "medusa":
            assert eng.config.num_lookahead_tokens == 3


def reference_drafts(head, target, tokens: list[int], k: int) -> list[int]:
    """The head's greedy chain from scratch: a fresh cache, the target's features of every committed
    token recomputed, one first pass over all of them, then k - 1 chained steps."""
    L, bs = len(tokens), 4
    kv = KVCacheManager((L + k) // bs + 2, bs)
    kv.allocate("r", 0, L + k)
    caches = target.allocate_kv_cache(kv.pool.num_blocks, bs)
    _, saved = target(*flatten(kv, [("r", tokens[:-1], 0)]), caches, head.cfg.hidden_layers)
    cache = head.allocate_kv_cache(kv.pool.num_blocks, bs)
    ids, meta = flatten(kv, [("r", tokens[1:], 0)])
    g = head(ids, head.features(torch.cat(saved, -1)), meta, cache)[-1:]
    drafts = []
    for i in range(k):
        drafts.append(int(head.logits(g).argmax()))
        if i + 1 < k:
            ids, meta = flatten(kv, [("r", [drafts[-1]], L - 1 + i)])
            g = head(ids, g, meta, cache)
    return drafts


@pytest.mark.parametrize("method,schedule", [("eagle", s) for s in SCHEDULES] +
                         [pytest.param(m, s, marks=SLOW) for m in ("eagle3", "mtp") for s in SCHEDULES])
def test_incremental_head_cache_drafts_what_a_fresh_run_drafts(tiny, method, schedule):
    """Every proposal the engine's head makes, with its KV kept incrementally in lookahead slots,
    rolled back after rejections and lost to preemption, equals the head's run from scratch."""
    head = random_head(tiny, method)
    prop = PROPOSERS[method](head, 3)
    eng = engine(tiny, prop, **SCHEDULES[schedule])
    checked = []
    inner = prop.propose

    def propose(requests, max_drafts, forward=None):  # the step's hidden states come with the call
        out = inner(requests, max_drafts, forward=forward)
        for r, k, p in zip(requests, max_drafts, out):
            if k > 0:
                assert p.token_ids == reference_drafts(head, tiny, r.all_token_ids, k), \
                    f"request {r.request_id} at {r.num_tokens} tokens: incremental drafts differ from a fresh run"
                checked.append(k)
        return out

    prop.propose = propose
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 11, 6, 20)]
    run_engine(eng, prompts, SamplingParams(temperature=0.8, max_tokens=30, ignore_eos=True))
    assert len(checked) > 30
    assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks


@pytest.mark.parametrize("method", ["eagle", "eagle3", "mtp"])
def test_training_forward_is_the_inference_forward(tiny, method):
    """head.dense with the training-time-test mask of step j at position t computes what the paged
    head computes for the (j-1)-th chained draft there (teacher-forced tokens)."""
    head = random_head(tiny, method, seed=3)
    T, t = 12, 9
    tokens = torch.randint(0, V, (T + 1,), generator=torch.Generator().manual_seed(4))
    kv = KVCacheManager(8, 4)
    kv.allocate("r", 0, T + 4)
    caches = tiny.allocate_kv_cache(8, 4)
    _, saved = tiny(*flatten(kv, [("r", tokens[:T].tolist(), 0)]), caches, head.cfg.hidden_layers)
    feats = head.features(torch.cat(saved, -1))  # (T, d)
    with torch.no_grad():
        past, f, dense = [], feats[None, :T - 1], []
        for j in (1, 2, 3):
            gj, kvj = head.dense(tokens[None, 1:T], f, torch.arange(T - 1), ttt_mask(T - 1, j), past)
            dense.append(gj[0])
            past.append(kvj)
            f = torch.cat([gj[:, :1], gj[:, :-1]], 1)
    cache = head.allocate_kv_cache(8, 4)
    ids, meta = flatten(kv, [("r", tokens[1:t].tolist(), 0)])  # first pass over positions < t - 1
    g = head(ids, feats[:t - 1], meta, cache)
    torch.testing.assert_close(g, dense[0][:t - 1], rtol=1e-4, atol=1e-4)
    g = g[-1:]
    for j, pos in ((2, t - 1), (3, t)):  # chained steps, with the true next tokens
        ids, meta = flatten(kv, [("r", [int(tokens[pos + 1])], pos)])
        g = head(ids, g, meta, cache)
        torch.testing.assert_close(g[0], dense[j - 1][pos], rtol=1e-4, atol=1e-4)


def test_medusa_heads_read_one_row_and_draft_in_one_pass(tiny):
    head = random_head(tiny, "medusa")
    h = torch.randn(3, tiny.config.hidden_size)
    logits = head(h)
    assert logits.shape == (4, 3, V)
    torch.testing.assert_close(head(h, 2), logits[:2])


# ----------------------------------------------------------------------------------------------
# refusals


def tiny_target(path, **config):
    tiny_llama(path, **config)
    return load_llama(path)


def test_a_head_for_another_target_is_refused(tiny, tmp_path):
    other = tiny_target(tmp_path / "other", vocab_size=V + 1, num_hidden_layers=4)
    save_head(random_head(other, "eagle"), tmp_path / "h")
    with pytest.raises(ValueError, match=r"vocab_size=38 \(target has 37\)"):
        load_head(tmp_path / "h", tiny)
    with pytest.raises(ValueError, match="is a eagle head, but speculative_config asks for method 'medusa'"):
        load_head(tmp_path / "h", other, method="medusa")
    deeper = tiny_target(tmp_path / "deep", vocab_size=V, num_hidden_layers=5)
    save_head(random_head(tiny, "eagle"), tmp_path / "h2")
    with pytest.raises(ValueError, match=r"num_hidden_layers=4 \(target has 5\)"):
        load_head(tmp_path / "h2", deeper)
    assert load_head(tmp_path / "h2", tiny).cfg.method == "eagle"


def test_head_directory_round_trips(tiny, tmp_path):
    head = random_head(tiny, "eagle3")
    save_head(head, tmp_path / "h", manifest={"steps": 0})
    back = load_head(tmp_path / "h", tiny)
    assert back.cfg == head.cfg
    for (n, a), (_, b) in zip(head.state_dict().items(), back.state_dict().items()):
        torch.testing.assert_close(a.half().float(), b, msg=n)
    assert (tmp_path / "h" / "MANIFEST.json").exists()


def test_speculative_config_takes_the_head_methods():
    from speclab.spec_config import SpeculativeConfig
    for method in PROPOSERS:
        assert SpeculativeConfig.from_dict({"method": method, "num_speculative_tokens": 2}).method == method
    with pytest.raises(ValueError, match="greater than zero"):
        SpeculativeConfig.from_dict({"method": "eagle", "num_speculative_tokens": 0})


def test_the_engine_refuses_too_few_lookahead_slots(tiny):
    with pytest.raises(ValueError, match="num_lookahead_tokens >= 3"):
        engine(tiny, EagleProposer(random_head(tiny, "eagle"), 3), num_lookahead_tokens=1)


def test_medusa_refuses_more_drafts_than_heads(tiny):
    with pytest.raises(ValueError, match="4 heads"):
        MedusaProposer(random_head(tiny, "medusa"), 5)


@pytest.mark.parametrize("draft_vocab_size", [None, 20])
def test_drafting_logits_are_the_training_logits(tiny, draft_vocab_size):
    """While drafting (inference mode) the head's LM head and fc go through PackedLinear (speclab's
    few-row kernel); training and evaluation keep F.linear. Both must compute the same function."""
    torch.manual_seed(5)
    head = build_head(new_config("eagle", tiny, draft_vocab_size=draft_vocab_size), tiny).eval()
    if draft_vocab_size:
        head.d2t.copy_(torch.randperm(V)[:draft_vocab_size].sort().values)
    g = torch.randn(3, tiny.config.hidden_size)
    with torch.no_grad():
        plain = head.logits(g)
    with torch.inference_mode():
        head.prepare()
        fast = head.logits(g)
        fc = head.inputs(torch.tensor([1, 2, 3]), g)
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fc, head.fc(torch.cat([tiny.model.embed_tokens(torch.tensor([1, 2, 3])), g], -1)).detach(),
                               rtol=1e-5, atol=1e-5)
    if draft_vocab_size:
        outside = torch.ones(V, dtype=torch.bool)
        outside[head.d2t] = False
        assert torch.isneginf(fast[:, outside]).all() and torch.isfinite(fast[:, head.d2t]).all()


# ----------------------------------------------------------------------------------------------
# widening an EAGLE head's MLP (speclab.train.heads --intermediate-size with --init)


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_a_widened_head_drafts_what_it_drafted_and_its_new_units_train(tiny, tmp_path, method):
    from speclab.train.heads import widen_mlp

    head = random_head(tiny, method, seed=5)
    I = head.cfg.layer["intermediate_size"]
    wide = widen_mlp(head, 3 * I, tiny, torch.Generator().manual_seed(0))
    assert wide.layer.mlp.up_proj.weight.shape[0] == 3 * I and head.layer.mlp.up_proj.weight.shape[0] == I
    assert wide.layer.mlp.up_proj.weight[I:].abs().sum() > 0  # fresh units, not zeros
    T = 10
    tokens = torch.randint(0, V, (1, T), generator=torch.Generator().manual_seed(6))
    feats = torch.randn(1, T, len(head.cfg.hidden_layers) * tiny.config.hidden_size, generator=torch.Generator().manual_seed(7))

    def dense(h):  # the training path: (1, T, d)
        return h.dense(tokens, h.features(feats), torch.arange(T), ttt_mask(T, 1))[0]

    with torch.no_grad():
        torch.testing.assert_close(dense(wide), dense(head), rtol=1e-5, atol=1e-5)
    kv = KVCacheManager(8, 4)  # the drafting path too: the paged, packed layer with the wider MLP
    kv.allocate("r", 0, T)
    ids, meta = flatten(kv, [("r", tokens[0].tolist(), 0)])
    f = head.features(feats[0])
    torch.testing.assert_close(wide(ids, f, meta, wide.allocate_kv_cache(8, 4)),
                               head(ids, f, meta, head.allocate_kv_cache(8, 4)), rtol=1e-5, atol=1e-5)
    save_head(wide, tmp_path / "w")
    assert load_head(tmp_path / "w", tiny).cfg.layer["intermediate_size"] == 3 * I
    dense(wide).pow(2).sum().backward()
    assert wide.layer.mlp.down_proj.weight.grad[:, I:].abs().sum() > 0  # the new units receive gradient
    with pytest.raises(ValueError, match="narrower than the head's"):
        widen_mlp(head, I - 1, tiny, torch.Generator())
