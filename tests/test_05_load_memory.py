"""Loading a checkpoint holds one copy of its weights (speclab.models.llama.load_llama): the file is read
into tensors that become the parameters, and prepare() moves them into their fused home layer by layer.
SmolLM2 in float32 (540 MB) had peaked at 1.8 GB resident while loading, three copies at once; a lesson
that loaded it then sat 0.5 GB higher for the rest of its run."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from speclab.models.llama import SAFETENSORS_DTYPES, load_llama, read_safetensors
from tests.helpers import tiny_llama


def test_read_safetensors_gives_what_safetensors_gives(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"f32": torch.randn(3, 5, generator=g), "f16": torch.randn(7, generator=g).half(),
               "bf16": torch.randn(2, 3, 4, generator=g).bfloat16(), "i64": torch.arange(6).view(2, 3),
               "bool": torch.tensor([True, False, True]), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4)}
    save_file(tensors, tmp_path / "t.safetensors", metadata={"format": "pt"})
    ours, theirs = read_safetensors(tmp_path / "t.safetensors"), load_file(str(tmp_path / "t.safetensors"))
    assert ours.keys() == theirs.keys() == tensors.keys()
    for name, t in theirs.items():
        assert ours[name].dtype == t.dtype and ours[name].shape == t.shape and torch.equal(ours[name], t), name
    assert {t.dtype for t in tensors.values()} <= set(SAFETENSORS_DTYPES.values())


def test_a_truncated_or_foreign_file_is_refused_by_name(tmp_path):
    save_file({"w": torch.ones(64)}, tmp_path / "t.safetensors")
    data = (tmp_path / "t.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-10])
    with pytest.raises(ValueError, match="truncated"):
        read_safetensors(tmp_path / "cut.safetensors")
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    header["w"]["dtype"] = "F8_E4M3"
    raw = json.dumps(header).encode()
    (tmp_path / "f8.safetensors").write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    with pytest.raises(ValueError, match="F8_E4M3"):
        read_safetensors(tmp_path / "f8.safetensors")


def test_loaded_weights_are_the_checkpoints_and_the_head_stays_tied(tmp_path):
    hf = tiny_llama(tmp_path / "m", vocab_size=50, seed=3, tie_word_embeddings=True)
    model = load_llama(tmp_path / "m")
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ours = model.state_dict()
    for name, t in hf.state_dict().items():
        assert torch.equal(ours[name], t), name


PEAK = """
import sys, torch
from speclab.models.llama import load_llama
def kb(key):
    return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024
before = kb("VmRSS")
model = load_llama(sys.argv[1])
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print((kb("VmHWM") - before) / weights)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the peak from /proc/self/status (Linux)")
def test_loading_peaks_near_one_copy_of_the_weights(tmp_path):
    """In a fresh process (a clean peak), with weights large enough (about 100 MB) that the interpreter's own
    growth is small beside them. Before the fix the peak above the starting point was 3.07 copies; now it is
    1.18, the extra mostly the tied embedding (a seventh of these weights), which is copied into its fused
    home whole."""
    tiny_llama(tmp_path / "m", vocab_size=8000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
               num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=True)
    out = subprocess.run([sys.executable, "-c", PEAK, str(tmp_path / "m")], capture_output=True, text=True,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}, check=True)
    copies = float(out.stdout.split()[-1])
    assert copies < 1.5, f"loading peaked at {copies:.2f} copies of the weights above where it started"
