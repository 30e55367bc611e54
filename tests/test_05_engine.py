"""speclab's Llama forward and engine against transformers' LlamaForCausalLM on the same weights."""

import pytest
import torch

from speclab.engine.llm_engine import LLMEngine
from speclab.kv_cache import KVCacheManager
from speclab.engine.batch import flatten
from speclab.models.llama import LlamaConfig, load_llama
from speclab.sampling_params import SamplingParams
from tests.helpers import run_engine, tiny_llama

V = 101  # not a power of two


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny Llama with GQA, saved as a Hugging Face checkpoint: (hf model, speclab model)."""
    path = tmp_path_factory.mktemp("tiny")
    hf = tiny_llama(path, vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                    max_position_embeddings=128, rope_theta=500.0)
    return hf, load_llama(path)


def hf_logits(hf, tokens):
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0]  # (L, V)


def run_chunks(model, kv, caches, chunks):
    """Forward one flattened batch: chunks = [(request_id, tokens, start)]. Returns logits per chunk."""
    for rid, toks, start in chunks:
        kv.allocate(rid, start, len(toks))
    input_ids, meta = flatten(kv, chunks)
    logits = model.compute_logits(model(input_ids, meta, caches)[0])
    return [logits[meta.query_start_loc[i]:meta.query_start_loc[i + 1]] for i in range(len(chunks))]


def test_config_and_weights_load_from_a_hf_directory(tiny):
    hf, ours = tiny
    assert ours.config.num_key_value_heads == 2 and ours.config.head_dim == 16
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())


def test_prefill_logits_equal_transformers(tiny):
    hf, ours = tiny
    tokens = torch.randint(0, V, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    kv = KVCacheManager(32, 8)
    got = run_chunks(ours, kv, ours.allocate_kv_cache(32, 8), [("a", tokens, 0)])[0]
    torch.testing.assert_close(got, hf_logits(hf, tokens), rtol=1e-4, atol=1e-4)


def test_ragged_batch_with_chunked_prefill_and_decode_equals_transformers(tiny):
    """Three requests advancing by different amounts in each flattened forward."""
    hf, ours = tiny
    g = torch.Generator().manual_seed(2)
    seqs = {r: torch.randint(0, V, (n,), generator=g).tolist() for r, n in [("a", 23), ("b", 9), ("c", 17)]}
    ref = {r: hf_logits(hf, t) for r, t in seqs.items()}
    kv = KVCacheManager(40, 4)
    caches = ours.allocate_kv_cache(40, 4)
    plan = [  # (request, start, length) per step: prefill chunks, single decodes, a k + 1 verify-sized chunk
        [("a", 0, 10), ("b", 0, 9)],
        [("a", 10, 7), ("c", 0, 5)],
        [("a", 17, 1), ("b", 9 - 0, 0), ("c", 5, 12)],
        [("a", 18, 5)],
    ]
    for step in plan:
        chunks = [(r, seqs[r][s:s + n], s) for r, s, n in step if n]
        for (r, toks, s), logits in zip(chunks, run_chunks(ours, kv, caches, chunks)):
            torch.testing.assert_close(logits, ref[r][s:s + len(toks)], rtol=1e-4, atol=1e-4)


def test_kv_after_rollback_and_reappend_equals_a_fresh_computation(tiny):
    """Write 6 'draft' positions, roll back 4 (as after a rejection), write 4 others: logits are fresh."""
    hf, ours = tiny
    g = torch.Generator().manual_seed(3)
    prefix, rejected, accepted = (torch.randint(0, V, (n,), generator=g).tolist() for n in (13, 6, 4))
    kv = KVCacheManager(16, 4)
    caches = ours.allocate_kv_cache(16, 4)
    run_chunks(ours, kv, caches, [("r", prefix, 0)])
    run_chunks(ours, kv, caches, [("r", rejected, 13)])
    kv.rollback("r", 15)  # keep 2 of the 6
    got = run_chunks(ours, kv, caches, [("r", accepted, 15)])[0]
    torch.testing.assert_close(got, hf_logits(hf, prefix + rejected[:2] + accepted)[15:], rtol=1e-4, atol=1e-4)


def engine_generate(model, prompts, params, **kw):
    return run_engine(LLMEngine(model, **{"num_kv_blocks": 64, "block_size": 8, "max_num_seqs": 4, **kw}), prompts, params)


def hf_greedy(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


@pytest.mark.parametrize("budget", [2048, 5])  # 5: every prompt is prefilled in chunks, batches stay ragged
def test_greedy_generate_equals_transformers(tiny, budget):
    hf, ours = tiny
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, V, (n,), generator=g).tolist() for n in (1, 7, 12, 30)]
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    outs = engine_generate(ours, prompts, params, max_num_batched_tokens=budget)
    for prompt, out in zip(prompts, outs):
        assert out == hf_greedy(hf, prompt, 15)


def test_small_pool_preempts_and_still_matches(tiny):
    """A pool that holds one request at a time forces preemption and recomputation: same greedy output."""
    hf, ours = tiny
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V, (10,), generator=g).tolist() for _ in range(3)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    eng = LLMEngine(ours, num_kv_blocks=7, block_size=4)  # 22 tokens need 6 blocks; two requests do not fit
    outs = run_engine(eng, prompts, params)
    assert eng.scheduler.num_preemptions > 0
    assert outs == [hf_greedy(hf, p, 12) for p in prompts]
    assert eng.kv.num_free_blocks == 7


def test_requests_too_large_get_clear_errors(tiny):
    _, ours = tiny
    eng = LLMEngine(ours, num_kv_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="raise num_kv_blocks"):
        eng.add_request([1] * 10, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="context of 128 tokens"):
        eng.add_request([1] * 100, SamplingParams(max_tokens=40))
    with pytest.raises(ValueError, match=r"\[0, 101\)"):
        eng.add_request([1, 500], SamplingParams())
    with pytest.raises(ValueError, match="empty prompt"):
        eng.add_request([], SamplingParams())


def test_stop_conditions(tiny):
    _, ours = tiny
    prompt = [3, 1, 4, 1, 5]
    free = engine_generate(ours, [prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    stop = free[4]
    out = engine_generate(ours, [prompt], SamplingParams(temperature=0, max_tokens=10, stop_token_ids=[stop]))[0]
    assert out == free[:free.index(stop) + 1]


def test_seeded_requests_reproduce_alone_and_in_any_batch(tiny):
    _, ours = tiny
    prompt = [7, 8, 9]
    seeded = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=20, seed=123, ignore_eos=True)
    other = SamplingParams(temperature=0.8, max_tokens=9, ignore_eos=True)
    alone = engine_generate(ours, [prompt], seeded)[0]
    eng = LLMEngine(ours, num_kv_blocks=64, block_size=8, seed=99)
    outs = run_engine(eng, [[1, 2], prompt, [5] * 9], [other, seeded, other])
    assert outs[1] == alone
    assert engine_generate(ours, [prompt], SamplingParams(temperature=1.0, max_tokens=20, seed=124,
                                                          ignore_eos=True))[0] != alone


@pytest.mark.parametrize("rule", ["standard", "block", "typical"])
def test_plain_sampling_s_race_draws_what_the_verifier_draws(tiny, monkeypatch, rule):
    """A step with no drafts, no seed and a temperature alone skips the verifier (`ModelRunner._race`): the
    same tokens from the same engine stream as the verifier's k = 0 row under every rule, in a batch of
    several temperatures; a request with top-k, top-p or a seed takes the verifier."""
    from speclab.engine import model_runner
    _, ours = tiny
    prompts = [[1, 2], [7, 8, 9], [5] * 9]
    params = [SamplingParams(temperature=t, max_tokens=12, ignore_eos=True) for t in (1.0, 0.7, 1.6)]
    races = []
    race = model_runner.ModelRunner._race
    monkeypatch.setattr(model_runner.ModelRunner, "_race", lambda self, *a: races.append(1) or race(self, *a))
    fast = run_engine(LLMEngine(ours, num_kv_blocks=64, block_size=8, seed=5, rejection_sample_method=rule),
                      prompts, params)
    assert races, "no step took the race"
    monkeypatch.setattr(model_runner, "temperature_only", lambda *a: False)  # every step through the verifier
    slow = run_engine(LLMEngine(ours, num_kv_blocks=64, block_size=8, seed=5, rejection_sample_method=rule),
                      prompts, params)
    assert fast == slow
    monkeypatch.undo()
    races.clear()
    monkeypatch.setattr(model_runner.ModelRunner, "_race", lambda self, *a: races.append(1) or race(self, *a))
    others = [SamplingParams(temperature=1.0, top_k=5, max_tokens=3), SamplingParams(temperature=1.0, top_p=0.9,
              max_tokens=3), SamplingParams(temperature=1.0, seed=3, max_tokens=3)]
    run_engine(LLMEngine(ours, num_kv_blocks=64, block_size=8, seed=5), [[1, 2]] * 3, others)
    assert not races, "a request with top-k, top-p or a seed skipped the verifier"


def test_triton_verifier_gives_the_same_outputs(tiny):
    """The engine with the Triton kernels (interpreted on a CPU) samples exactly what the torch path does."""
    from speclab.kernels import rejection_sample as kernel
    if not kernel.interpreted():
        pytest.skip("the kernels compile for this machine's GPU and the engine runs on the CPU: "
                    "tests/test_07_kernel.py checks them on the GPU")
    _, ours = tiny
    prompts = [[2, 3], [4, 5, 6, 7]]
    params = SamplingParams(temperature=1.0, max_tokens=4, seed=7, ignore_eos=True)
    assert engine_generate(ours, prompts, params, verifier="triton") == \
        engine_generate(ours, prompts, params, verifier="torch")


def test_unsupported_configs_are_refused():
    base = dict(vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="Llama-architecture"):
        LlamaConfig.from_hf({**base, "model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope scaling"):
        LlamaConfig.from_hf({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
