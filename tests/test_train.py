"""The training recipe of the embedded pair runs end to end on a tiny configuration in seconds.

The committed checkpoints come from the same code with `--preset full` (scripts/train_pair.sh).
"""

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from speclab.data.corpus import collect, corpus_hash, split_of
from speclab.train import EOS, TrainSpec, loss_fn, save_tokenizer, train_tokenizer
from speclab.train.lm import lr_at
from speclab.train.pipeline import run


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pair")
    man = run("tiny", out=out, prompts_out=out / "prompts.json")
    return out, man


def test_pipeline_writes_hf_checkpoints_and_manifest(tiny_run):
    out, man = tiny_run
    assert man["default_draft"] in ("draft-data", "draft-distilled")
    assert set(man["models"]) == {"target", "draft-data", "draft-distilled"}
    assert man["models"]["draft-distilled"]["loss_kind"] == "forward_kl"
    assert man["models"]["draft-data"]["steps"] == man["models"]["draft-distilled"]["steps"]
    for name, fig in man["models"].items():
        d = out / fig["directory"]
        for f in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json"):
            assert (d / f).exists(), (name, f)
        assert json.loads((d / "config.json").read_text())["dtype"] == "float16"
        model = AutoModelForCausalLM.from_pretrained(d, local_files_only=True, dtype=torch.float32)
        assert sum(p.numel() for p in model.parameters()) == fig["parameters"]
        for key in ("heldout_loss", "heldout_ppl", "tokens_seen", "final_train_loss", "train_minutes"):
            assert np.isfinite(fig[key]), (name, key)
    for name in ("draft-data", "draft-distilled"):
        fig = man["models"][name]
        assert 0 <= fig["top1_agreement"] <= 1 and 0 < fig["mean_sum_min_pq"] <= 1 and fig["c"] > 0
    assert (out / "corpus_files.json").exists() and man["reproduce"].startswith("python -m speclab.train")
    sets = json.loads((out / "prompts.json").read_text())
    assert {"code", "copy", "prose"} <= set(sets)


def test_periodic_checkpoints_exist(tiny_run):
    out, _ = tiny_run
    state = json.loads((out / "_work" / "target" / "training_state.json").read_text())
    assert state["step"] >= 1


def test_tokenizer_round_trips_code(tmp_path):
    texts = ["def f(x):\n    return x + 1\n", "class A:\n\tpass  # tab\n\n\n", "s = 'héllo ✓'\r\n"] * 20
    tok = train_tokenizer(texts, vocab_size=300)
    save_tokenizer(tok, tmp_path)
    hf = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert hf.eos_token == EOS and hf.bos_token == EOS
    for text in texts[:3] + ["    x = [1,  2]\n\n  \t y = {}\n", "¿unseen 漢字 bytes?\x00"]:
        assert hf.decode(hf.encode(text)) == text


def test_split_is_by_module_and_deterministic():
    files = collect(limit=5)
    assert all(f.split == split_of(f.module) for f in files)
    assert not any("test" in f.name.split("/")[:-1] for f in files)
    assert corpus_hash(files) == corpus_hash(list(reversed(files)))


def test_distillation_loss_is_forward_kl():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1)
    target, draft = LlamaForCausalLM(cfg).eval(), LlamaForCausalLM(cfg).eval()
    x = torch.randint(0, 50, (2, 9))
    assert loss_fn(target, x, teacher=target).abs().item() < 1e-5          # KL(p || p) = 0
    with torch.no_grad():
        log_p = torch.log_softmax(target(input_ids=x[:, :-1]).logits, -1)
        log_q = torch.log_softmax(draft(input_ids=x[:, :-1]).logits, -1)
    expected = (log_p.exp() * (log_p - log_q)).sum(-1).mean()
    assert torch.allclose(loss_fn(draft, x, teacher=target), expected, atol=1e-5)


def test_lr_schedule_warms_up_then_decays_to_floor():
    spec = TrainSpec(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    lrs = [lr_at(s, spec) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:])) and lrs[-1] == pytest.approx(0.1, abs=1e-3)
    assert lr_at(50, spec, progress=1.0) == pytest.approx(0.1)
