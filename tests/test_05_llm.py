"""The LLM front end on the embedded pair: vLLM's offline API, greedy equality with transformers."""

import pytest
import torch

from speclab import LLM, SamplingParams
from speclab.data.prompts import load_prompts
from speclab.metrics import spec_decode_counters
from speclab.models.hub import load_model, load_tokenizer

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def llm():
    return LLM()


@pytest.fixture(scope="module")
def hf():
    return load_model("target"), load_tokenizer("target")


def hf_greedy(hf, prompt: str, n: int) -> list[int]:
    model, tok = hf
    ids = torch.tensor([tok.encode(prompt)])
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=tok.eos_token_id)
    return out[0, ids.shape[1]:].tolist()


def test_greedy_equals_transformers_at_batch_1_and_in_a_ragged_batch(llm, hf):
    prompts = load_prompts("code")[:4] + load_prompts("prose")[:2]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    expected = [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]
    alone = [llm.generate(p, params, use_tqdm=False)[0].outputs[0].token_ids for p in prompts[:2]]
    assert alone == expected[:2]
    batch = llm.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in batch] == expected


def test_request_output_shape_and_text(llm):
    out = llm.generate(["def add(a, b):\n    return", {"prompt_token_ids": [5, 6, 7]}],
                       [SamplingParams(temperature=0, max_tokens=5), SamplingParams(max_tokens=3, seed=1)],
                       use_tqdm=False)
    assert out[0].prompt.startswith("def add") and out[1].prompt is None and out[1].prompt_token_ids == [5, 6, 7]
    first = out[0].outputs[0]
    assert first.text == llm.tokenizer.decode(first.token_ids) and first.finish_reason in ("length", "stop")
    with pytest.raises(ValueError, match="one per prompt"):
        llm.generate(["a", "b"], [SamplingParams()] * 3)


def test_speculative_llm_is_exact_and_counts(llm):
    prompts = load_prompts("copy")[:3]
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    for config in ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1},
                   {"method": "draft_model", "model": "draft", "num_speculative_tokens": 3}):
        spec = LLM(speculative_config=config)
        assert [o.outputs[0].token_ids for o in spec.generate(prompts, params, use_tqdm=False)] == plain
        m = spec_decode_counters(spec.get_metrics())
        assert m["num_drafts"] > 0 and 0 <= m["num_accepted_tokens"] <= m["num_draft_tokens"]
        assert set(m) >= {"num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos",
                          "mean_acceptance_length"}
        text = spec.metrics_text()
        assert f"speclab:spec_decode_num_drafts_total {float(m['num_drafts'])}" in text
        assert 'speclab:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text


def test_a_draft_with_another_vocabulary_is_refused(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM
    LlamaForCausalLM(LlamaConfig(vocab_size=1000, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, max_position_embeddings=512)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"draft vocab_size=1000 != target vocab_size=\d+: a draft must share"):
        LLM(speculative_config={"method": "draft_model", "model": str(tmp_path), "num_speculative_tokens": 2})


def test_prompt_longer_than_the_context_is_refused(llm):
    with pytest.raises(ValueError, match="exceeds the model's context"):
        llm.generate({"prompt_token_ids": [1] * 500}, SamplingParams(max_tokens=100), use_tqdm=False)


def test_the_kv_pool_costs_the_blocks_written_not_its_size():
    """The pool is zeros that become resident as they are written (`llama.kv_zeros`): allocating
    1 GB of blocks must not make 1 GB resident (torch.zeros would: it writes every byte), written
    blocks keep their values and unwritten ones read as zeros."""
    import os

    from speclab.models.hub import checkpoint_dir
    from speclab.models.llama import load_llama

    def resident_mb():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    if not os.path.exists("/proc/self/statm"):
        pytest.skip("needs /proc/self/statm (Linux) to read resident memory")
    model = load_llama(checkpoint_dir("target"))
    block_size = 16
    num_blocks = int(2**30 // (model.kv_bytes_per_token() * block_size))  # 1 GB of pool
    before = resident_mb()
    caches = model.allocate_kv_cache(num_blocks, block_size)
    pool_mb = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in caches) / 2**20
    assert 1000 <= pool_mb <= 1030
    assert resident_mb() - before < 0.05 * pool_mb, "allocating the pool made it resident"
    k0 = caches[0][0]
    k0[3].fill_(2.5)
    assert k0[3].eq(2.5).all() and k0[:3].eq(0).all() and k0[-1].eq(0).all()
    assert resident_mb() - before < 0.05 * pool_mb, "writing one block made the pool resident"
