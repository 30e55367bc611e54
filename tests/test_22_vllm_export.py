"""Checkpoints in the formats real vLLM loads (speclab/export_vllm.py) and the converter's `architectures`."""

import json
import shutil

import pytest
import torch

from speclab import export_vllm
from speclab.models import smollm2
from speclab.models.hub import checkpoint_dir
from tests.helpers import needs_smollm2_wheel


def test_the_converter_names_the_architecture_of_an_older_cache_in_place(tmp_path):
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (old / "model.safetensors").write_bytes(b"weights")
    smollm2._name_architecture(old)
    assert json.loads((old / "config.json").read_text()) == {"architectures": ["LlamaForCausalLM"],
                                                             "hidden_size": 8, "model_type": "llama"}
    assert (old / "model.safetensors").read_bytes() == b"weights", "only config.json changes"
    assert sorted(p.name for p in old.iterdir()) == ["config.json", "model.safetensors"], "no temporary file left"
    smollm2._name_architecture(old)   # idempotent


def test_export_draft_names_the_architecture_and_keeps_the_weights(tmp_path):
    src = tmp_path / "draft"
    shutil.copytree(checkpoint_dir("draft"), src)
    config = json.loads((src / "config.json").read_text())
    config["architectures"] = None     # as speclab's SmolLM2 draft ships
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="names no architecture"):
        export_vllm.vllm_dir(str(src))
    out = export_vllm.export_draft(src, tmp_path / "out")
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert (out / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert (out / "tokenizer.json").is_file(), "vLLM loads the tokenizer from the draft's directory too"
    assert export_vllm.vllm_dir(str(out)) == out
    assert export_vllm.vllm_dir("target") == checkpoint_dir("target")


def test_an_exact_eagle_export_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="approximate=True"):
        export_vllm.export_eagle()


@needs_smollm2_wheel()
def test_the_approximate_eagle_export_is_vllm_s_layout(tmp_path):
    from safetensors.torch import load_file

    from speclab.models.heads import head_directory
    out = export_vllm.export_eagle(out=tmp_path / "eagle", approximate=True)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["EagleLlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["speclab_export"]["approximate"] is True
    got = load_file(str(out / "model.safetensors"))
    head = load_file(str(head_directory("eagle-smollm2") / "model.safetensors"))
    assert "fc.weight" in got and not any("input_layernorm" in k for k in got), sorted(got)
    assert set(got) == {"fc.weight"} | {"layers.0." + k.removeprefix("layer.") for k in head
                                        if k.startswith("layer.") and "input_layernorm" not in k}
    assert torch.equal(got["fc.weight"], head["fc.weight"].float())
    assert config["vocab_size"] == 49152 and config["hidden_size"] == head["fc.weight"].shape[0]
