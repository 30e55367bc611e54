"""Speculative decoding on the real model, SmolLM2-135M-Instruct (Q4_1-dequantized).

Greedy: speculative output equals plain output token for token, on a ragged batch of held-out
chat prompts, for n-gram and draft-model speculation in float32 and in bfloat16, and for EAGLE (its
3-star with an n-gram chain grafted in) in float32. The draft is
the distilled "smollm2-draft" when it resolves here, else a stand-in built in a temporary
directory: the target cut to its first 2 layers (same tokenizer; it drafts poorly, which is what
a test of exactness wants: many rejections).

Sampling at T = 1: the joint law of the first two generated tokens, from many speclab samples with
and without speculation, against transformers' softmax on the same weights (the reference cannot
share speclab's bugs); a sampler at temperature 0.8 and a verifier that accepts every draft must
fail the same test.

Greedy equality holds within one dtype and one batch composition, the way these tests compare.
Why not across them: a GEMM's blocking depends on the batch shape (how many rows, which kernel),
so the same row can be summed in a different order in a batch of 1 and in a batch of 8, or in a
1-token decode and a (k + 1)-token verification. In float32 that moves a logit by ~1e-5, which
flips the argmax only at a near-tie (observed: never, on these prompts). In bfloat16 every
activation is rounded to 8 bits of mantissa after each layer, so a 1e-7 difference in the
float32 accumulator can move an activation by one bf16 ulp (0.4%), and 30 layers later a logit
by ~1e-2: a greedy choice between two tokens closer than that can flip. That is why a bf16
greedy test compares speclab with itself in one batch composition, never bf16 with float32
or batch 1 with batch 8.
"""

import numpy as np
import pytest
import torch

from speclab import stats
from speclab.chat import chat_prompt_ids
from speclab.data.chat_prompts import load_chat_prompts
from speclab.metrics import spec_decode_counters
from speclab.models import smollm2
from tests.helpers import needs_smollm2_wheel
from speclab.verify import rejection_sample

pytestmark = [pytest.mark.real_model, needs_smollm2_wheel()]
SIGNIFICANCE = 1e-4
NGRAM = {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
EAGLE_GRAFT = {"method": "eagle", "model": "eagle-smollm2", "num_speculative_tokens": 6,  # lesson 10's graft
               "speculative_token_tree": "[(0,), (1,), (2,)]", "graft_method": "ngram", "prompt_lookup_max": 3,
               "prompt_lookup_min": 1}

SMALL_POOL_GB = 0.1  # 2,200 tokens of KV: these 4-prompt batches need ~1,000; the 1 GB default is memory for nothing


@pytest.fixture(scope="module")
def smol_dir():
    return smollm2.model_dir()


@pytest.fixture(scope="module")
def draft_dir(smol_dir, tmp_path_factory):
    """'smollm2-draft' when it resolves to a local checkpoint, else the 2-layer stand-in."""
    from speclab.bench.prompts import find_draft
    from tests.helpers import truncated_llama
    return find_draft("smollm2-draft") or truncated_llama(smol_dir, tmp_path_factory.mktemp("draft") / "d", 2)


@pytest.fixture(scope="module")
def ragged_prompts(smol_dir):
    """One held-out conversation of each set (41 to 213 tokens): a ragged batch."""
    from speclab.models.hub import load_tokenizer
    tok = load_tokenizer(str(smol_dir))
    return [{"prompt_token_ids": chat_prompt_ids(tok, load_chat_prompts(kind)[1])}
            for kind in ("edit", "codegen", "qa", "chat")]


def generate(llm, prompts, **params):
    from speclab import SamplingParams
    outs = llm.generate(prompts, SamplingParams(**{"temperature": 0.0, "max_tokens": 32, "ignore_eos": True,
                                                   **params}), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs]


def draft_config(draft_dir, method="greedy", k=3):
    return {"method": "draft_model", "model": str(draft_dir), "num_speculative_tokens": k,
            "draft_sample_method": method}


# --- greedy: speculation changes the speed, never the tokens -----------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_speculation_equals_plain_on_a_ragged_batch(smol_dir, draft_dir, ragged_prompts, dtype):
    """n-gram, draft-model and (in float32) EAGLE speculation, its 3-star with an n-gram chain grafted in,
    vs plain decoding, the same 4 prompts batched the same way and one dtype (see the module docstring for
    why bf16 compares only within itself)."""
    from speclab import LLM
    plain = generate(LLM(str(smol_dir), dtype=dtype, kv_cache_gb=SMALL_POOL_GB), ragged_prompts)
    # The graft verifies up to 7 rows a request, 28 a step here: past cpu_gemm.MAX_ROWS (16), where a GEMM
    # library's blocking takes over and a bfloat16 row can round differently from a decode step's (seen: the chat
    # prompt's 15th token changed, 2026-12-07, Zen 4). It is compared in float32, where such a row moves by ~1e-5.
    graft = (EAGLE_GRAFT,) if dtype == "float32" else ()
    for config in (NGRAM, draft_config(draft_dir), *graft):
        llm = LLM(str(smol_dir), dtype=dtype, speculative_config=config, kv_cache_gb=SMALL_POOL_GB)
        assert generate(llm, ragged_prompts) == plain, f"{config['method']} ({dtype}) changed a greedy output"
        m = spec_decode_counters(llm.get_metrics())
        assert m["num_accepted_tokens"] > 0, f"{config['method']} accepted nothing: the test did not exercise acceptance"
        assert m["num_accepted_tokens"] < m["num_draft_tokens"], "nothing was rejected: rollback was not exercised"
        del llm  # before the next LLM loads its own copy of the target: one at a time


@pytest.mark.slow
def test_greedy_speculation_equals_plain_with_chunked_prefill(smol_dir, draft_dir, ragged_prompts):
    """A token budget of 64 per step: prefills are chunked and share steps with verifications."""
    from speclab import LLM
    plain = generate(LLM(str(smol_dir), kv_cache_gb=SMALL_POOL_GB), ragged_prompts, max_tokens=24)
    llm = LLM(str(smol_dir), max_num_batched_tokens=64, speculative_config=draft_config(draft_dir, k=4),
              kv_cache_gb=SMALL_POOL_GB)
    assert generate(llm, ragged_prompts, max_tokens=24) == plain


def test_dtype_names_follow_vllm(smol_dir):
    from speclab import LLM
    from speclab.llm import resolve_dtype
    assert resolve_dtype("bfloat16", smol_dir) == torch.bfloat16
    assert resolve_dtype("float32", smol_dir) == torch.float32 == resolve_dtype(torch.float32, smol_dir)
    assert resolve_dtype("auto", smol_dir) == torch.float32          # the converted checkpoint says float32
    assert LLM(str(smol_dir), dtype="bfloat16", num_kv_blocks=8).model.lm_head.weight.dtype == torch.bfloat16
    for bad in ("fp8", "int8", torch.int32, 16):
        with pytest.raises(ValueError, match=r"dtype must be .*'auto', 'float32'.*'bfloat16'"):
            LLM(str(smol_dir), dtype=bad)


def test_bfloat16_weights_give_float32_probabilities(smol_dir):
    """Logits (so probabilities, softmax and verification) are float32 whatever the weights' dtype."""
    from speclab.engine.batch import flatten
    from speclab.kv_cache import KVCacheManager
    from speclab.models.llama import load_llama
    model = load_llama(smol_dir, dtype=torch.bfloat16)
    kv = KVCacheManager(4, 16)
    kv.allocate("r", 0, 5)
    hidden, _ = model(*flatten(kv, [("r", [1, 2, 3, 4, 5], 0)]), model.allocate_kv_cache(4, 16))
    assert hidden.dtype == torch.bfloat16 and model.compute_logits(hidden).dtype == torch.float32


# --- sampling at T = 1: the first two tokens follow transformers' law --------------------------

# One token; a broad first-token law (entropy 3.9 nats, top token 0.42). With N = 2000 samples the
# law has 21 first tokens and 50 cells of expected count >= 5: the chi-squared test (p < 1e-4 fails)
# detects every TV distance >= 0.107 with power 0.99 (stats.min_detectable_tv). The controls are far
# beyond that: T = 0.8 moves the first token alone by TV 0.26; accepting every draft makes the second
# token follow the 2-layer stand-in's q instead of p.
PROMPT = "The"
N = 2000


@pytest.fixture(scope="module")
def law(smol_dir):
    """Cells over (x1, x2) and their exact probabilities from transformers' float32 softmax:
    x1 in S1 = {p1 * N >= 5}; for each, x2 in S2(x1) = {p1 p2 * N >= 5}, an 'other x2' cell, and one
    'other x1' cell. Returns (ids, cell_of(x1, x2), probs)."""
    from speclab.models.hub import load_model, load_tokenizer
    tok, hf = load_tokenizer(str(smol_dir)), load_model(str(smol_dir))
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        p1 = hf(torch.tensor([ids])).logits[0, -1].double().softmax(-1)  # (V,)
        s1 = torch.nonzero(p1 * N >= 5).flatten().tolist()
        p2 = hf(torch.tensor([ids + [x] for x in s1])).logits[:, -1].double().softmax(-1)  # (|S1|, V)
    cells, probs = {}, []
    for i, x1 in enumerate(s1):
        joint = p1[x1] * p2[i]  # (V,)
        for x2 in torch.nonzero(joint * N >= 5).flatten().tolist():
            cells[(x1, x2)] = len(probs)
            probs.append(float(joint[x2]))
        cells[(x1, None)] = len(probs)  # every other x2 after this x1
        probs.append(float(p1[x1] * (1 - p2[i][joint * N >= 5].sum())))
    cells[(None, None)] = len(probs)
    probs.append(1.0 - float(p1[s1].sum()))

    def cell_of(x1, x2):
        if (x1, x2) in cells:
            return cells[(x1, x2)]
        return cells[(x1, None)] if (x1, None) in cells else cells[(None, None)]
    return ids, cell_of, np.clip(np.array(probs), 0, None)


def sample_counts(llm, law, temperature=1.0, seeded=False) -> np.ndarray:
    """Counts over the law's cells of the first two tokens of N requests run together. Requests run
    to 2 + k tokens so that the second token comes from a verification of k drafts (near max_tokens
    the engine drafts fewer). k = 1 suffices: later drafts cannot change the second token."""
    from speclab import SamplingParams
    ids, cell_of, probs = law
    k = llm.speculative_config.num_speculative_tokens if llm.speculative_config else 0
    params = [SamplingParams(temperature=temperature, max_tokens=2 + k, ignore_eos=True,
                             seed=i if seeded else None) for i in range(N)]
    counts = np.zeros(len(probs), dtype=np.int64)
    for out in llm.generate([{"prompt_token_ids": ids}] * N, params, use_tqdm=False):
        x1, x2 = out.outputs[0].token_ids[:2]
        counts[cell_of(x1, x2)] += 1
    return counts


def pvalue(counts, probs) -> tuple[float, float]:
    """(chi-squared p-value, the smallest TV distance this N and these cells detect with power 0.99)."""
    cells = int((probs * N >= 5).sum()) + 1
    return stats.chi2_gof(counts, probs), stats.min_detectable_tv(N, cells, SIGNIFICANCE)


def make_llm(smol_dir, speculative_config=None):
    from speclab import LLM
    return LLM(str(smol_dir), speculative_config=speculative_config, max_num_seqs=256, max_num_batched_tokens=2048,
               num_kv_blocks=600, block_size=4)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["plain-seeded", "draft-probabilistic", "draft-greedy-seeded"])
def test_first_two_tokens_follow_transformers_law(smol_dir, draft_dir, law, case):
    """Plain sampling (position-keyed seeds), and draft speculation with q kept (Leviathan's
    accept/residual on the engine's stream) or argmax drafts checked against keyed samples."""
    config = None if case == "plain-seeded" else draft_config(draft_dir, "probabilistic" if "prob" in case else
                                                              "greedy", k=1)
    llm = make_llm(smol_dir, config)
    counts = sample_counts(llm, law, seeded="seeded" in case)
    pv, tv = pvalue(counts, law[2])
    assert pv > SIGNIFICANCE, f"{case}: the first two tokens differ from transformers' law (p={pv:.1e}); " \
                              f"this test detects TV >= {tv:.3f}"
    if config:
        m = spec_decode_counters(llm.get_metrics())
        assert 0 < m["num_accepted_tokens"] < m["num_draft_tokens"], "verification accepted all or nothing"


@pytest.mark.slow
def test_negative_control_temperature_0_8_fails(smol_dir, law):
    """A sampler at T = 0.8 (first-token TV 0.26 from T = 1) must fail the same test."""
    pv, tv = pvalue(sample_counts(make_llm(smol_dir), law, temperature=0.8), law[2])
    assert pv < SIGNIFICANCE, f"the law test cannot see temperature 0.8 (p={pv:.2e}, detects TV >= {tv:.3f})"


def accept_every_draft(draft_ids, num, target_probs, draft_probs=None, *, uniforms=None, **kw):
    """A broken verifier: the coin always says accept (u ~ 0), so drafts pass whatever p says."""
    return rejection_sample(draft_ids, num, target_probs, draft_probs,
                            uniforms=torch.full_like(uniforms, torch.finfo(torch.float64).tiny), **kw)


@pytest.mark.slow
def test_negative_control_accepting_every_draft_fails(smol_dir, draft_dir, law):
    llm = make_llm(smol_dir, draft_config(draft_dir, "probabilistic", k=1))
    llm.engine.runner.verifier = accept_every_draft
    pv, tv = pvalue(sample_counts(llm, law), law[2])
    assert pv < SIGNIFICANCE, f"the law test cannot see a verifier that accepts every draft (p={pv:.2e})"
