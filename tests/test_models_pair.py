"""The embedded model pair: loads offline, shares one tokenizer, and matches its manifest."""

import json
import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from speclab.data import KINDS, load_prompts
from speclab.models import (CHECKPOINTS, check_pair, checkpoint_dir, load_manifest, load_model, load_pair,
                            load_tokenizer, tokenizer_sha256)

MANIFEST = load_manifest()
NAMES = ("target", "draft-data", "draft-distilled")


@pytest.fixture(scope="module")
def pair():
    return load_pair()


@pytest.mark.parametrize("name", NAMES)
def test_checkpoints_load_offline_with_transformers(name):
    d = checkpoint_dir(name)
    model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(d, local_files_only=True)
    assert model.config.model_type == "llama" and model.config.vocab_size == len(tok)
    assert sum(p.numel() for p in model.parameters()) == MANIFEST["models"][name]["parameters"]


def test_speclab_loaders_return_float32_eval_models(pair):
    target, draft, tok = pair
    for m in (target, draft):
        assert not m.training and next(m.parameters()).dtype == torch.float32
    assert sum(p.numel() for p in draft.parameters()) == MANIFEST["models"][MANIFEST["default_draft"]]["parameters"]
    assert load_model().config.num_hidden_layers == target.config.num_hidden_layers
    assert load_tokenizer().get_vocab() == tok.get_vocab()


def test_checkpoints_are_fp16_safetensors_and_small():
    total = sum(f.stat().st_size for f in CHECKPOINTS.rglob("*")   # the embedded pair only: the heads of lesson 08
                if f.is_file() and not {"heads", "smollm2-draft"} & set(f.parts))  # and the real model's draft have
    assert total < 50e6                      # their own caps (test_08_shipped_heads, test_10_smollm2_draft)
    for name in NAMES:
        cfg = json.loads((checkpoint_dir(name) / "config.json").read_text())
        assert cfg["dtype"] in ("float16", "bfloat16")


def test_target_and_drafts_share_the_tokenizer():
    hashes = {tokenizer_sha256(n) for n in NAMES}
    assert len(hashes) == 1
    sizes = {AutoModelForCausalLM.from_pretrained(checkpoint_dir(n), local_files_only=True).config.vocab_size
             for n in NAMES}
    assert sizes == {MANIFEST["tokenizer"]["vocab_size"]}


@pytest.mark.parametrize("kind", KINDS)
def test_tokenizer_round_trips_committed_code(kind):
    tok = load_tokenizer()
    records = load_prompts(kind, with_reference=True)
    assert 20 <= len(records) <= 50
    for r in records:
        for text in (r["prompt"], r["reference"], r["prompt"] + r["reference"]):
            ids = tok.encode(text)
            assert tok.decode(ids) == text
            assert tok.eos_token_id not in ids


def test_prompts_are_short_and_copy_prompts_repeat_material():
    tok = load_tokenizer()
    for kind in KINDS:
        assert all(len(tok.encode(p)) <= 400 for p in load_prompts(kind))
    for r in load_prompts("copy", with_reference=True):
        assert r["reference"].strip().splitlines()[0] in r["prompt"]
    with pytest.raises(ValueError, match="unknown prompt kind"):
        load_prompts("poetry")


def test_mismatched_vocab_raises_a_clear_error(tmp_path):
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    v = MANIFEST["tokenizer"]["vocab_size"]
    with pytest.raises(ValueError, match=f"draft vocab_size=100 != target vocab_size={v}: a draft must share"):
        load_pair(draft=tmp_path)


def test_mismatched_tokenizer_raises_a_clear_error(tmp_path):
    v = MANIFEST["tokenizer"]["vocab_size"]
    cfg = LlamaConfig(vocab_size=v, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    src = checkpoint_dir("target")
    shutil.copy(src / "tokenizer_config.json", tmp_path)
    tj = json.loads((src / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    a, b = list(vocab)[100], list(vocab)[101]
    vocab[a], vocab[b] = vocab[b], vocab[a]               # same size, two ids swapped
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ValueError, match="draft tokenizer .* must share the target's tokenizer"):
        load_pair(draft=tmp_path)


def test_check_pair_accepts_the_embedded_pair(pair):
    check_pair(pair.target, pair.draft, pair.tokenizer, pair.tokenizer)


def test_manifest_figures_are_present():
    assert MANIFEST["python_version"] and len(MANIFEST["corpus_sha256"]) == 64
    assert MANIFEST["default_draft"] in ("draft-data", "draft-distilled")
    assert (CHECKPOINTS / "draft" / "config.json").exists()
    for name in NAMES:
        fig = MANIFEST["models"][name]
        for key in ("parameters", "steps", "tokens_seen", "batch_size", "seq_len", "final_train_loss",
                    "heldout_loss", "heldout_ppl", "train_minutes", "seed"):
            assert key in fig, (name, key)
    for name in ("draft-data", "draft-distilled"):
        for key in ("top1_agreement", "mean_sum_min_pq", "c"):
            assert key in MANIFEST["models"][name], (name, key)
    assert MANIFEST["reproduce"].startswith("python -m speclab.train")


def test_greedy_generation_runs(pair):
    target, draft, tok = pair
    ids = tok(load_prompts("code")[0], return_tensors="pt").input_ids
    with torch.no_grad():
        out = target.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=tok.eos_token_id)
    assert out.shape[1] == ids.shape[1] + 8 or tok.eos_token_id in out[0, ids.shape[1]:].tolist()
